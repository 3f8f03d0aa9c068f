"""Every site by name (:data:`SITES`) and the one a run uses (:func:`site_name`).

A site is where a run's cells go (:class:`runner.backends.site.Site`). Another scheduler
(Slurm, Kubernetes) is one module implementing that interface and one entry here.
"""

from __future__ import annotations

from collections.abc import Callable

from gate_residual_matrix.runner.backends.local import LocalSite
from gate_residual_matrix.runner.backends.ray.site import RaySite
from gate_residual_matrix.runner.backends.site import Site, SiteOptions

__all__ = ["SITES", "site_name"]

SITES: dict[str, Callable[[SiteOptions], Site]] = {"local": LocalSite.choose, "ray": RaySite}
"""Every site by name, made from the run's options (checked, nothing connected yet)."""


def site_name(options: SiteOptions) -> str:
    """The site of a run: ``ray`` with ``--cluster ADDRESS``, else ``local``.

    Example::

        >>> site_name(SiteOptions(cluster="ray://head:10001"))
        'ray'
    """
    return "local" if options.cluster is None else "ray"
