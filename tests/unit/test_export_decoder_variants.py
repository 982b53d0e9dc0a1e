"""A registered decoder spec named alone (``tritonforge export smollm2``) exports what the default
export does: its int8 default and the fp32 twin. It exported fp32 only and so replaced the served
int8 ``generate`` with fp32 (two engineers' repositories lost ``generate_fp32`` that way)."""

from __future__ import annotations

import pytest

from tritonforge.export.cli import decoder_int8, parse_args
from tritonforge.export.specs import decoder_names, get_decoder


@pytest.mark.parametrize("name", decoder_names())
def test_a_registered_decoder_alone_exports_its_int8_default(name: str) -> None:
    args = parse_args([name])
    assert decoder_int8(args.quantize, get_decoder(name).serving.variants)


@pytest.mark.parametrize(
    ("quantize", "variants", "int8"),
    [
        (None, ("fp32", "int8"), True),
        ("int8", ("fp32", "int8"), True),
        ("none", ("fp32", "int8"), False),
        (None, ("fp32",), False),
    ],
)
def test_quantize_flag_and_variants(
    quantize: str | None, variants: tuple[str, ...], int8: bool
) -> None:
    assert decoder_int8(quantize, variants) is int8
