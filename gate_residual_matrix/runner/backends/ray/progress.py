"""Progress of a cluster run, per node: which cell runs where, its cases, its end.

The tasks (:func:`runner.backends.ray.node.run_on_node`) post events to an :class:`Events` actor
on the head node (the node a run needs anyway) without waiting for an answer (a task that
waits in ``ray.get`` lends its CPU to the next task, and a node would run more cells than
it offers CPUs); the driver takes them while it waits for reports and prints one line per
event::

    [cluster] node 1b2c3d4e (gpu:NVIDIA H200): host-plain-cuda started (attempt 1 of 3)
    [cluster] node 1b2c3d4e (gpu:NVIDIA H200): host-plain-cuda: case 4/30 (32768) 21.2 s; ...
    [cluster] node 1b2c3d4e (gpu:NVIDIA H200): host-plain-cuda ok in 302 s

and, at the end, each node's cells and busy time.
"""

from __future__ import annotations

import time

from gate_residual_matrix.runner.cell.progress import duration

PREFIX = "[cluster] "


class Events:
    """The progress queue of one run, as a Ray actor: ``post.remote(event)`` from the tasks
    (in the order each task posts), :meth:`take` from the driver."""

    def __init__(self) -> None:
        self.items: list[dict] = []

    def post(self, event: dict) -> None:
        """Keep ``event`` (a dict: ``kind`` start or line, ``key``, ``node``, ...)."""
        self.items.append(event)

    def take(self) -> list[dict]:
        """The events posted since the last call, oldest first."""
        items, self.items = self.items, []
        return items


class Progress:
    """The driver's side of the progress queue of one
    :meth:`runner.backends.ray.cluster.Cluster.run`.

    ``cluster``: the :class:`runner.backends.ray.cluster.Cluster` (its ``nodes``, ``label``,
    ``retries``);
    ``names``: each job's key and its cell id.
    """

    def __init__(self, cluster, names: dict[int, str]) -> None:
        self.cluster, self._names = cluster, dict(names)
        ray = cluster.ray
        self.queue = ray.remote(Events).options(**self._on_head(cluster)).remote()
        self._where: dict[tuple[int, int], str] = {}
        self._ended: set[tuple[int, int]] = set()
        self._since: dict[tuple[int, int], float] = {}
        self._busy: dict[str, list[float]] = {}

    @staticmethod
    def _on_head(cluster) -> dict:
        """Actor options: no CPU, and on the head node where there is one (a worker node
        may die with its cells; the queue must not die with it)."""
        options: dict = {"num_cpus": 0}
        head = [i for i, n in cluster.nodes.items()
                if "node:__internal_head__" in n.get("Resources", {})]
        if head:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(head[0], soft=True)
        return options

    def say(self, text: str) -> None:
        """Print one ``[cluster]`` line."""
        print(PREFIX + text, flush=True)

    def node_of(self, key: int, attempt: int) -> str | None:
        """The node id attempt ``attempt`` of job ``key`` started on, if it said so."""
        self.drain()
        return self._where.get((key, attempt))

    def drain(self) -> None:
        """Print the events that have arrived (never raises: progress is not worth it)."""
        try:
            events = self.cluster.ray.get(self.queue.take.remote(), timeout=30)
        except Exception:
            return
        for event in events:
            node = event.get("node")
            if node and node not in self.cluster.nodes:
                self.cluster.refresh()
            label = self.cluster.label(node)
            if event.get("kind") == "start":
                attempt = (event["key"], event["attempt"])
                self._where.setdefault(attempt, node)
                if attempt in self._ended:  # came after its report: nothing to show now
                    continue
                self._since[attempt] = time.monotonic()
                self.say(f"{label}: {self._cell(event['key'])} started (attempt "
                         f"{event['attempt'] + 1} of {self.cluster.retries + 1})")
            elif event.get("kind") == "line":
                self.say(f"{label}: {event['text'].removeprefix('[runner] ')}")

    def ran_on(self, key: int, attempt: int, node: str) -> None:
        """Attempt ``attempt`` of job ``key`` ran on ``node`` (its task said so with its
        report, which may come before its ``start`` event)."""
        self._where[(key, attempt)] = node

    def finished(self, job, attempt: int, report: dict) -> None:
        """One line for a cell's end, on the node its last attempt ran on; counts that
        node's busy time."""
        self._ended.add((job.key, attempt))
        node = self._where.get((job.key, attempt))
        since = self._since.get((job.key, attempt))
        took = time.monotonic() - since if since is not None and node else None
        if node is not None:
            cells, busy = self._busy.setdefault(node, [0, 0.0])
            self._busy[node] = [cells + 1, busy + (took or 0.0)]
        reason = f": {report['reason']}" if report.get("reason") else ""
        self.say(f"{self.cluster.label(node)}: {job.cell.id} {report['status']}"
                 + (f" in {duration(took)}" if took is not None else "") + reason)

    def summary(self) -> None:
        """One line per node that ran cells: how many and its busy time."""
        for node, (cells, busy) in self._busy.items():
            self.say(f"{self.cluster.label(node)}: {cells} cell(s), busy {duration(busy)}")

    def _cell(self, key: int) -> str:
        return self._names.get(key, f"cell {key}")
