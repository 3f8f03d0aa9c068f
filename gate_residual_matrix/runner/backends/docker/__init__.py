"""The docker backend: each docker stack's image, each cell in its own container.

Every docker-py call of the project lives in this package, in two modules with one job each:
:mod:`~runner.backends.docker.engine` (is an engine there; build images with a progress
display, never pulling; prune; import a root file system) and
:mod:`~runner.backends.docker.cells` (:class:`DockerBackend`: one locked-down container per
cell, its report stamped with the image; it builds a missing image only when told to,
``matrix --build``); what that container may do is plain data, made by
:mod:`~runner.backends.docker.container`. The images themselves are rendered, with no
docker-py call, by :mod:`runner.backends.docker.images`. docker-py is optional (``pip install
'.[docker]'``):
without it :meth:`DockerBackend.available` says so and ``--backend auto`` uses the host.
"""
