"""Where a pass over a loader starts: DataLoader's rule, kept with exact
resumption.

Each ``iter(loader)`` is a pass over one epoch, as with torch's DataLoader.
A pass begun after one that stopped before its epoch's end (a ``break``,
``itertools.islice``, ``zip`` with a shorter iterable, a loop of
``len(loader)`` calls to ``next()``, or a ``next(iter(loader))`` peek) starts
the next epoch from its beginning rather than going on with the rest of the
old one: such loops are written for DataLoader, and going on would give
them a short or empty epoch, or a StopIteration inside the program's loop.
A pass begun right after the loader was placed (its creation,
``set_epoch()``, ``load_state_dict()``, ``reshard()``) starts where it was
placed, so a resumed run goes on exactly where it left off.

``set_epoch(e)`` right after ``load_state_dict()`` of a position in epoch
``e`` keeps that position, as torchdata's StatefulDataLoader does: a loop
that calls ``set_epoch(epoch)`` at every epoch's start (DistributedSampler's
pattern, and stoker's README) resumes mid-epoch instead of training the
epoch's first batches again."""
import logging


class Passes:
    """One loader's record of whether it was placed since its last pass began."""

    __slots__ = ("_placed", "_restored", "_said")

    def __init__(self):
        self._placed = True
        self._restored = False
        self._said = False  # the first epoch left unfinished is logged, once

    def placed(self, restored=False):
        """The loader was moved to a position of the program's choosing
        (``restored``: by load_state_dict())."""
        self._placed = True
        self._restored = restored

    def keeps_restored(self, epoch, current_epoch):
        """Whether set_epoch(``epoch``) leaves the loader where
        load_state_dict() put it (in ``current_epoch``, no pass begun since)."""
        keep = self._restored and epoch == current_epoch
        self._restored = False
        return keep

    def begin(self, native, batches_per_epoch):
        """Called as a pass begins; returns the number of batches the
        previous pass left its epoch at when the pass starts the next epoch
        (after moving ``native`` there), else None."""
        placed, self._placed, self._restored = self._placed, False, False
        if placed:
            return None
        state = native.state()
        consumed, epoch = int(state["batches_consumed"]), int(state["epoch"])
        if consumed == 0:
            return None
        # At an epoch's end (every batch handed out), set_epoch keeps the work already running ahead into the next.
        native.set_epoch(epoch + 1)
        if consumed < batches_per_epoch and not self._said:
            self._said = True
            logging.getLogger("stoker").info(
                "a loop left epoch %d after %d of its %d batches; the next loop starts epoch %d, as with DataLoader "
                "(load_state_dict() of a saved position goes on from there instead; said once)",
                epoch, consumed, batches_per_epoch, epoch + 1)
        return consumed


class EpochSampler:
    """``stoker.Loader.sampler`` and ``stoker.TokenLoader.sampler``: what
    training loops written for DataLoader with a DistributedSampler ask of
    ``loader.sampler``. ``set_epoch(e)`` is the loader's ``set_epoch`` (so
    ``loader.sampler.set_epoch(epoch)`` works as written); ``len()`` is the
    samples (rows, for a TokenLoader) this rank's batches hold an epoch, as
    DistributedSampler's (torch's ImageNet example compares it with
    ``len(loader.dataset)``). The order itself is drawn natively from
    (seed, epoch): there are no indices to iterate."""

    __slots__ = ("_loader",)

    def __init__(self, loader):
        self._loader = loader

    def set_epoch(self, epoch):
        self._loader.set_epoch(epoch)

    @property
    def epoch(self):
        return self._loader.epoch

    def __len__(self):
        return self._loader._rank_samples_per_epoch()

    def __iter__(self):
        raise TypeError("stoker.%s's sampler has no indices to iterate: the order is drawn natively from "
                        "(seed, epoch); iterate the loader (with_indices=True gives each batch's indices)"
                        % type(self._loader).__name__)

    def __repr__(self):
        return "stoker.%s sampler (epoch %d, %d on this rank)" % (type(self._loader).__name__, self.epoch, len(self))
