"""``make bench`` (``python -m tritonforge.loadtest.bench``): the cells (:mod:`.cells`), how each
is measured (:mod:`.runners`), the medians and ratios (:mod:`.aggregation`), the tables and chart
(:mod:`.report`), the classification half (:mod:`.classify`) and the command line (:mod:`.cli`);
plus the generation benches (:mod:`.generate`, :mod:`.generate_llamacpp`), :mod:`.hops` and
:mod:`.decoder_experiments`."""
