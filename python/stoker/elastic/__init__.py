"""Elastic training: workers leave and join, training goes on, every sample
exactly once.

    import stoker, stoker.elastic
    loader = stoker.Loader("data", global_batch_size=256, with_indices=True)
    summary = stoker.elastic.run(lambda x, y: F.cross_entropy(model(x), y),
                                 model=model, optimizer=opt, loader=loader, epochs=10,
                                 checkpointer=dict(directory="ckpt", every_steps=500))

Or keep your own loop and DistributedDataParallel model:
``stoker.elastic.Trainer`` (its help has the loop). A model sharded with
FSDP2 within replica groups: ``stoker.elastic.replica_group_mesh()``.

Run it with ``python -m stoker.elastic.launch`` (torchrun's flags; add
``--in-process`` so that survivors re-form the group instead of restarting),
with torchrun itself, or as one plain process. See the README's "Elastic
training" and examples/elastic_train.py.
"""


class ElasticError(RuntimeError):
    """Elastic training cannot go on: too few workers within the timeout, a
    loader that cannot be resharded, a group that cannot be re-formed."""


class PeerFailure(RuntimeError):
    """A collective failed: a peer died, hung past the timeout, or left the
    group. The in-process mode re-forms the group; under torchrun the worker
    exits so that the agent restarts the group."""


from .policy import BatchPolicy, StragglerPolicy, rank_share  # noqa: E402
from ._runner import RunSummary, detect_mode, run  # noqa: E402
from ._sharded import replica_group_mesh  # noqa: E402
from ._trainer import Trainer  # noqa: E402

__all__ = ["run", "Trainer", "replica_group_mesh", "BatchPolicy", "StragglerPolicy", "RunSummary", "ElasticError", "PeerFailure",
           "rank_share", "detect_mode"]
