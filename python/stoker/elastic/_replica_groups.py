"""Replica groups in the in-process rendezvous (launch --replica-group-size,
a model sharded within each group): a generation admits whole groups only,
waits for a group still coming but not for one that lost a member, and
gives each worker the groups of its shard's holders and of its siblings.
Mixed into Rendezvous, whose store and watch it uses."""
import logging

from . import ElasticError, PeerFailure
from ._group import Group, _peek, make_device_group, make_gloo

log = logging.getLogger("stoker.elastic")


class GroupLeft(Exception):
    """This worker's replica group lost a member (its shard is gone): the
    others went on without the group, and this worker leaves so that its
    launcher starts the group again."""


class ReplicaGroups:
    def _admitted_or_leave(self, registrants, generation, was_member):
        """The generation's members (whole groups) when this worker is one;
        None when its group was not whole yet (a joiner: try the next one);
        GroupLeft when it was a member before and its group broke."""
        members = self._admitted(registrants)
        if self.id in members:
            return members
        if was_member:
            raise GroupLeft("generation %d closed without this worker's replica group %s (a member is gone)"
                            % (generation, self.replica[0]))
        log.info("generation %d closed before this worker's replica group was whole; joining the next", generation)
        return None

    def _spec(self, store, who):
        """(group id, index, size) of a registrant (a worker outside any
        replica group counts as a group of its own)."""
        spec = self._specs.get(who)
        if spec is None:
            value = _peek(store, "rgm/" + who)
            if value is None:
                spec = (who, 0, 1)
            else:
                gid, index, size = value.rsplit(":", 2)
                spec = (gid, int(index), int(size))
            self._specs[who] = spec
        return spec

    def _admitted(self, registrants, store=None):
        """The registrants of whole replica groups, in registration order."""
        store = store or self.store
        count = {}
        for who in registrants:
            gid, _, size = self._spec(store, who)
            count[gid] = count.get(gid, 0) + 1
        return [who for who in registrants if count[self._spec(store, who)[0]] == self._spec(store, who)[2]]

    def _groups_to_wait_for(self, store, registered, previous, alive, now):
        """Replica groups some of whose workers registered but not all,
        which may still come: not those that had a member in the last
        generation that is gone (a group that lost a shard leaves whole)."""
        seen = {}
        for who in registered:
            gid, _, size = self._spec(store, who)
            seen.setdefault(gid, [0, size])[0] += 1
        incomplete = {gid for gid, (n, size) in seen.items() if n < size}
        if not incomplete:
            return []
        for who in previous or []:
            gid = self._spec(store, who)[0]
            if gid in incomplete and who not in registered and not alive(who, now):
                incomplete.discard(gid)
        return sorted(incomplete)

    def _replica_dimension(self, members, generation, others):
        """The group of the workers holding this worker's shard, one in each
        replica group of the generation (a Group; its ``shard`` and
        ``group_size`` say which shard of how many)."""
        _, shard, group_size = self.replica
        sizes = {self._spec(self.store, m)[2] for m in members}
        if sizes != {group_size}:
            raise ElasticError("generation %d has replica groups of %s workers: every launcher's "
                               "--replica-group-size must be the same" % (generation, sorted(sizes)))
        peers = [m for m in members if self._spec(self.store, m)[1] == shard]
        position = peers.index(self.id)
        try:
            pg = make_gloo(self.store, "pg%d-r%d" % (generation, shard), position, len(peers), self.timeout)
            device_pg = make_device_group(self.device_backend, self.store, "pg%d-r%d-device" % (generation, shard),
                                          position, len(peers), self.timeout)
        except RuntimeError as e:
            raise PeerFailure("generation %d: the group of shard %d could not connect: %s" % (generation, shard,
                                                                                              e)) from e
        replica = Group(pg, position, len(peers), generation, watch=self.watch(others, generation),
                        probe=lambda: self.probe(others), device_pg=device_pg, owns_device_pg=device_pg is not None)
        replica.shard, replica.group_size = shard, group_size
        # The group's place among the generation's groups by id: the same on each of its workers (the persistent
        # checkpoints' writer is chosen by it, see _sharded_checkpoint.py).
        replica.group_order = sorted({self._spec(self.store, m)[0] for m in members}).index(self.replica[0])
        # The replica group's own small group, whose watched check before each step keeps a worker out of FSDP's
        # collectives (which nothing watches) when a sibling has left the generation.
        gid = self.replica[0]
        try:
            siblings = make_gloo(self.store, "pg%d-s%s" % (generation, gid), shard, group_size, self.timeout)
        except RuntimeError as e:
            raise PeerFailure("generation %d: replica group %s could not connect: %s" % (generation, gid, e)) from e
        replica.siblings = Group(siblings, shard, group_size, generation, watch=self.watch(others, generation),
                                 probe=lambda: self.probe(others))
        return replica
