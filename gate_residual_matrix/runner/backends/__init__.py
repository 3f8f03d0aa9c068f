"""Where cells run: sites, and the backends that run one cell.

A site (:class:`~runner.backends.site.Site`) is where a run's cells go: this machine
(:class:`~runner.backends.local.LocalSite`) or a Ray cluster
(:class:`~runner.backends.ray.site.RaySite`), listed in :data:`.sites.SITES`. The runner
submits the cells that must run to it and drains it for their reports.

Backends run one cell somewhere and return its report, behind one interface.

:class:`~runner.backends.base.Backend`: ``available()``, ``prepare(...)``,
``fingerprint_extra(...)``, ``run(...)``; one failure classifier for all of them
(:mod:`runner.backends.failure`). Listed in :data:`.registry.BACKENDS`. Every subprocess call
lives in
:mod:`runner.backends.host`, every docker-py call in :mod:`runner.backends.docker`.

Which backend runs a cell (:func:`.registry.route`): a ``kind: host`` stack always runs on
the host; a ``kind: docker`` stack runs in the docker backend, and is ``skipped`` (with the reason)
when the run uses the host backend. ``--backend auto`` (:func:`.registry.resolve`) is docker when an
engine answers, else host. Before any cell runs, the backend's ``prepare`` decides which
docker stacks cannot run here (no engine, no image: a matrix run never builds one unless
told to with ``--build``, which builds the missing images first) and names them once.
"""
