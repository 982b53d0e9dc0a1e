"""The image task's errors: one base, a leaf per way an item can be refused.

Every one is a caller mistake (Triton ``INVALID_ARG``, HTTP 400) and names the item by its index in
the request, so the caller knows which image to fix; the other items are still answered.
"""

from __future__ import annotations

from tritonforge.errors import InvalidInputError


class ImageError(InvalidInputError):
    """An image item was refused; ``index`` is its position in the request."""

    def __init__(self, index: int, message: str) -> None:
        self.index = index
        super().__init__(f"image[{index}]: {message}")


class ImageDecodeError(ImageError):
    """Not an image of an accepted format: empty, truncated, corrupt or another kind of file."""


class ImageTooLargeError(ImageError):
    """Over the declared byte or pixel limit (a decompression bomb, an extreme aspect ratio)."""
