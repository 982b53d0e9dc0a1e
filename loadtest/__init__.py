"""Load testing and benchmarking of the served pipelines (Locust, SLO gates, ``make bench``).

Layout: the folder names the tool or role, the module the task (``embed``, ``classify``,
``generate``) or, when shared by the tasks, its job; a task's variant of a shared job is
``<job>_<task>`` (``run_generate``, ``soak_generate``):

- ``locust/``: Locust users, one base user per protocol with task hooks (``base``), the options
  and SLO listeners every locustfile shares (``options``, ``common``), the ``generate`` and ``ramp``
  locustfiles and the bounded runs (``run``, ``run_generate``); a task folder's ``loadtest``
  holds its own locustfile and bench cell (``tritonforge/tasks/<task>/loadtest/``);
- ``bench/``: ``make bench`` (``python -m tritonforge.loadtest.bench``: ``cli``, ``cells``,
  ``runners``, ``aggregation``, ``report``), the generation benches (``generate``,
  ``generate_llamacpp``) and ``hops``;
- ``anchors/``: what the benches compare against: ``fastapi/`` and ``inprocess/`` (one module per
  task), ``llamacpp``, ``ortgenai``;
- ``reliability/``: ``soak``, ``soak_generate``, ``chaos``, ``ramp``;
- ``perf_analyzer/``: the binary (``tool``) and its input data (``inputs``);
- here: ``corpus``, ``discovered`` (the pipelines), ``slo`` (gates, validation) and ``errors``.
"""
