"""``make bench`` (``python -m tritonforge.loadtest.bench``): the cells (:mod:`.cells`), how each
is measured (:mod:`.runners`), the medians and ratios (:mod:`.aggregation`), the tables and chart
(:mod:`.report`) and the command line (:mod:`.cli`), with the cells of other tasks reached through
the registry (a task folder's ``loadtest.BENCH``, :func:`.cells.task_bench`: classification's);
plus the generation benches (:mod:`.generate`, :mod:`.generate_llamacpp`) and :mod:`.hops` (the
decoder's int8 experiments are the generation task's ``loadtest.decoder_experiments``)."""
