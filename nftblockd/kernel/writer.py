"""Kernel-side operations built on `netlink.NftSocket`: set up the table, apply element ops, verify, repair.

Blocking; the daemon calls it from its single kernel worker thread. What it guarantees:
- `write` never loses the rest of a batch because of one bad element: the offender is located through the
  extack offset, reported with its errno, and the transaction is resent without it;
- deleting an element that is already gone is not an error (DESTROYSETELEM where the kernel has it, else
  ENOENT on a delete is dropped and the batch resent);
- a timeout of 0 is never sent (0 means "never expires"): an op whose end has passed is reported as expired;
- re-adding an element refreshes its timeout: TIMEOUT + EXPIRATION on kernels that update timeouts (>= 6.12),
  destroy + add in the same transaction elsewhere;
- `setup` leaves exactly the planned chains in our table, in the transaction that installs the rules: a chain
  no longer planned (an ingress device dropped from the config, an old hook) is deleted, one attached at
  another priority is deleted and made again, and an ingress chain exists only while its device does
  (`sync_ingress` follows devices that come and go);
- a set's drop rule is installed only while the set may hold elements (ruleset.py says when): the first add
  to a set without its rule carries the rule in the same transaction, `drop_idle_rules` removes the rules of
  sets the kernel counts empty, and setup installs the rules of the sets that hold something.
"""

from __future__ import annotations

import bisect
import errno as E
import ipaddress
import itertools
import logging
import operator
import time
from collections.abc import Sequence
from typing import cast

from nftblockd.addr import IPNet, net_key
from nftblockd.kernel import nfmsg as m
from nftblockd.kernel import ruleset as rs
from nftblockd.kernel.bans import OpSpec, SetOp, TimedSpecs
from nftblockd.kernel.batcher import Group
from nftblockd.kernel.links import Links
from nftblockd.kernel.netlink import KernelError, KernelSetInfo, NftSocket, kernel_release
from nftblockd.kernel.setwriter import Features, IngressChange, WriteResult

log = logging.getLogger("nftblockd.kernel")

RULE_COMMENT_PREFIX = "nftblockd"  # every rule ruleset.py writes carries a comment starting with this
ADD_FLAGS = m.NLM_F_REQUEST | m.NLM_F_CREATE  # no EXCL: re-adding an existing element is not an error
_ADD, _UNTIL_MS, _COMMENT = (operator.attrgetter(a) for a in ("add", "until_ms", "comment"))  # OpSpec columns


class KernelStateError(Exception):
    """The kernel holds objects nftblockd cannot use as they are (e.g. a set of the wrong type)."""


_Where = tuple[m.SetMessage, list[int], bool]  # message, op ids of its group, is a delete



def flat_ops(groups: Sequence[Group]) -> tuple[list[str], list[int], list[OpSpec]]:
    """The groups as the general path's flat, parallel arrays: op i is (names[i], keys[i], specs[i])."""
    names: list[str] = []
    keys: list[int] = []
    specs: list[OpSpec] = []
    for g in groups:
        names += [g.set_name] * len(g.keys)
        keys += g.keys
        specs += g.specs
    return names, keys, specs

class KernelWriter:
    """The SetWriter over netlink (setwriter.SetWriter)."""

    def __init__(self, plan: rs.Ruleset, sock: NftSocket | None = None, *, protect: bool = True,
                 links: Links | None = None) -> None:
        self.plan = plan
        self.sock = sock or NftSocket()
        self.protect = protect
        self.features = Features(kernel_release(), False, False, False, False)
        self.table_flags = 0
        self._links = links  # made on first use, in the namespace of the thread that uses it (the daemon's)
        # the sets whose drop rules are installed; None until setup says which (until then: assume all)
        self.filled: set[str] | None = None

    @property
    def plan(self) -> rs.Ruleset:
        return self._plan

    @plan.setter
    def plan(self, plan: rs.Ruleset) -> None:
        """A reload may change the chains (ingress devices, hook); the sets stay as they are."""
        self._plan = plan
        self._specs = {s.name: s for s in plan.sets}

    def chains(self, devices: set[str] | None = None) -> tuple[rs.ChainSpec, ...]:
        """The chains as they are (to be) installed: the devices present, the filled sets' rules."""
        return rs.chains_for(self.plan, self._devices() if devices is None else devices, self.filled)

    def _devices(self) -> set[str]:
        """The devices that exist now; no question asked when no chain needs one."""
        if not any(c.device for c in self.plan.chains):
            return set()
        if self._links is None:
            self._links = Links()
        return self._links.names()

    # -- set-up ----------------------------------------------------------------------------------------

    def setup(self, allowlist: Sequence[IPNet]) -> None:
        """Create or adopt the table, verify existing sets, (re)install chains, rules and the allowlist.

        One transaction, so a reload never leaves a gap. Raises KernelStateError for unusable objects.
        """
        self.sock.get_generation()
        self._refuse_foreign_table()
        existing = self.sock.list_sets(self.plan.table)
        self._verify_sets(existing)
        stale = tuple(name for name in existing if name not in self._specs)
        # a set made by this transaction is empty; a kernel without NFTA_SET_COUNT leaves count None: filled
        filled = {name for name, info in existing.items() if name in self._specs and info.count != 0}
        filled &= {s.name for s in self.plan.sets if s.blocklist is not None}
        flags_options = [m.NFT_TABLE_F_OWNER | m.NFT_TABLE_F_PERSIST] if self.protect else []
        flags_options.append(0)
        last_error: KernelError | None = None
        for flags in flags_options:
            out = None
            # a device can go between our look and the commit (older kernels then refuse its chain, ENOENT):
            # look again, a few times
            for _attempt in range(3):
                wanted = rs.chains_for(self.plan, self._devices(), filled)
                delete = rs.chain_changes(wanted, self.sock.list_chains(self.plan.table))
                msgs = rs.encode_ruleset(self.plan, flags, self.sock.next_seq(10000), stale, chains=wanted,
                                         delete_chains=delete)
                msgs += self._allowlist_msgs(allowlist)
                out = self.sock.transact(msgs)
                if out.committed or out.errors[0].errno != E.ENOENT or not any(c.device for c in self.plan.chains):
                    break
            assert out is not None
            if out.committed:
                self.table_flags = flags
                self.filled = filled
                for name in delete:
                    log.info("chain %s removed from table inet %s (%s)", name, self.plan.table,
                             "replaced" if name in {c.name for c in wanted} else "no longer configured")
                break
            err = out.errors[0]
            last_error = KernelError(err.errno, f"creating table inet {self.plan.table}", err.text)
            if err.errno == E.EPERM and flags:
                raise KernelError(E.EPERM, f"table inet {self.plan.table} is owned by another process "
                                  "(is another nftblockd running in this network namespace?)")
            log.info("table flags %#x refused (%s); trying without ownership", flags, last_error)
        else:
            assert last_error is not None
            raise last_error
        owner = bool(self.table_flags & m.NFT_TABLE_F_OWNER)
        self.features = Features(kernel_release(), owner, bool(self.table_flags & m.NFT_TABLE_F_PERSIST),
                                 *self._probe_elements())

    def _refuse_foreign_table(self) -> None:
        """A table of our name that someone else wrote rules into is not ours to take over: setup replaces
        the rules of our chains, so an admin's rule there would vanish without a word. Our own leftover table
        (kept after a stop, no longer owned) holds only rules with our comments."""
        exists, flags = self.sock.table_exists(self.plan.table)
        if not exists or flags & m.NFT_TABLE_F_OWNER:
            return  # absent, or owned (by us: a reload; by another process: setup says so)
        foreign = [(chain, comment) for chain, comment in self.sock.list_rules(self.plan.table)
                   if not (comment or "").startswith(RULE_COMMENT_PREFIX)]
        if foreign:
            shown = ", ".join(f"chain {c}: {cm or 'a rule without a comment'}" for c, cm in foreign[:3])
            more = f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
            raise KernelStateError(
                f"table inet {self.plan.table} already exists and holds rules nftblockd did not write ({shown}"
                f"{more}); nftblockd replaces the rules of its table, so it will not take this one over. "
                "Give nftblockd a table of its own (`table:` in the config) or remove that table")

    def sync_ingress(self) -> IngressChange:
        """Attach the ingress chains whose device exists now and is still without one, detach (delete) those
        whose device is gone, and give the base chain the matching skip rules: one transaction, nothing sent
        when nothing changed."""
        for _attempt in range(3):
            chains = self.chains()
            wanted = {c.name: c for c in chains if c.device}
            existing = self.sock.list_chains(self.plan.table)
            attach = [c for name, c in wanted.items() if name not in existing]
            detach = {name: hook.device for name, hook in sorted(existing.items())
                      if hook is not None and hook.device is not None and name not in wanted}
            if not attach and not detach:
                return IngressChange((), ())
            base = [c for c in chains if c.device is None]
            msgs = rs.encode_chains(self.plan, base + attach, self.sock.next_seq(10000), delete_chains=list(detach))
            out = self.sock.transact(msgs)
            if out.committed:
                return IngressChange(tuple(c.device or "" for c in attach), tuple(d or "" for d in detach.values()))
            if out.errors[0].errno != E.ENOENT:  # ENOENT: a device (or, on older kernels, its chain) just went
                err = out.errors[0]
                raise KernelError(err.errno, "updating the ingress chains", err.text)
        raise KernelError(E.EAGAIN, "updating the ingress chains", "devices kept changing")

    def _verify_sets(self, existing: dict[str, KernelSetInfo]) -> None:
        problems = []
        for name, info in existing.items():
            spec = self._specs.get(name)
            if spec is None:
                continue
            want_type = m.TYPE_IPADDR if spec.version == 4 else m.TYPE_IP6ADDR
            want_flags = spec.flags
            if info.key_type != want_type or info.key_len != spec.key_len or (info.flags & 0x1F) != want_flags:
                problems.append(
                    f"set {name} in table inet {self.plan.table} exists with key type {info.key_type}/"
                    f"{info.key_len} bytes and flags {info.flags:#x}; nftblockd needs type {want_type}/"
                    f"{spec.key_len} bytes and flags {want_flags:#x}. Delete the table "
                    f"(nft delete table inet {self.plan.table}) or choose another table name")
        if problems:
            raise KernelStateError("; ".join(problems))

    def _allowlist_msgs(self, allowlist: Sequence[IPNet]) -> list[bytes]:
        msgs = []
        for v in (4, 6):
            name = rs.set_name(rs.ALLOW, v, True)
            msgs.append(rs.encode_flush_set(self.plan.table, name, self.sock.next_seq()))
            nets = sorted(ipaddress.collapse_addresses(n for n in allowlist if n.version == v))  # type: ignore
            elems = [m.encode_element(_interval_element(n, None, "")) for n in nets]
            if elems:
                msgs += [sm.data for sm in m.split_set_messages(
                    m.NFT_MSG_NEWSETELEM, m.NFPROTO_INET, self.plan.table, name, elems,
                    self.sock.next_seq(len(elems) + 1), ADD_FLAGS)]
        return msgs

    def _probe_elements(self) -> tuple[bool, bool]:
        """Probe DESTROYSETELEM and timeout update on a scratch set (kernel versions lie: backports)."""
        t = self.plan.table
        probe = rs.SetSpec("nftblockd_probe", 4, False, True, 16, "probe")
        key = bytes((192, 0, 2, 1))
        seq = self.sock.next_seq(10)
        create = [rs.encode_set(t, probe, 9999, seq)]
        self.sock.transact(create)
        destroy = self._elements(m.NFT_MSG_DESTROYSETELEM, probe.name, [m.encode_element(m.Element(key))],
                                 m.NLM_F_REQUEST)
        destroy_ok = self.sock.transact(destroy).committed
        update_ok = False
        add1 = self._elements(m.NFT_MSG_NEWSETELEM, probe.name,
                              [m.encode_element(m.Element(key, 60000))], ADD_FLAGS)
        add2 = self._elements(m.NFT_MSG_NEWSETELEM, probe.name,
                              [m.encode_element(m.Element(key, 120000, refresh=True))], ADD_FLAGS)
        if self.sock.transact(add1).committed and self.sock.transact(add2).committed:
            e = self.sock.get_element(t, probe.name, key)
            update_ok = bool(e and e.expiration_ms and e.expiration_ms > 60000)
        self.sock.transact([rs.encode_del_set(t, probe.name, self.sock.next_seq())])
        return destroy_ok, update_ok

    def _elements(self, msg_type: int, set_name: str, encoded: Sequence[bytes], flags: int) -> list[bytes]:
        return [sm.data for sm in m.split_set_messages(msg_type, m.NFPROTO_INET, self.plan.table, set_name,
                                                       encoded, self.sock.next_seq(len(encoded) + 1), flags)]

    # -- element ops ----------------------------------------------------------------------------------

    def write_ops(self, ops: Sequence[SetOp], now_ms: int | None = None) -> WriteResult:
        """Convenience for callers holding individual ops (tests, tools)."""
        groups: dict[str, tuple[list[int], list[OpSpec]]] = {}
        for o in ops:
            keys, specs = groups.setdefault(o.set_name, ([], []))
            keys.append(o.key)
            specs.append(OpSpec(o.add, o.until_ms, o.comment, o.existed))
        return self.write([Group(name, keys, specs) for name, (keys, specs) in groups.items()], now_ms)

    def write(self, groups: Sequence[Group], now_ms: int | None = None) -> WriteResult:
        """Apply ops in as few transactions as possible; see the module docstring for the guarantees."""
        t0 = time.perf_counter()
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        unruled = self._unruled(groups)
        rules = self._rule_msgs(unruled)
        fast = self._write_uniform(groups, now_ms, rules)
        if fast is not None:
            self._ruled(unruled)
            fast.seconds = time.perf_counter() - t0
            return fast
        res = WriteResult()
        names, keys, specs = flat_ops(groups)
        live: list[int] = []
        for i, spec in enumerate(specs):
            if names[i] not in self._specs:
                res.failed[(names[i], keys[i])] = (E.ENOENT, f"no set {names[i]}")
            elif spec.add and spec.until_ms is not None and spec.until_ms - now_ms <= 0:
                res.expired.append((names[i], keys[i]))  # never send a timeout of 0 (= never expires)
            else:
                live.append(i)
        no_replace: set[int] = set()  # refreshes whose delete half found nothing: just add
        rule_retries = 2
        if unruled:  # a set whose adds all ended already stays empty, and without a rule
            unruled &= {names[i] for i in live if specs[i].add}
            rules = self._rule_msgs(unruled)
        for _attempt in range(len(live) + 3):
            if not live:
                break
            msgs, where = self._encode(names, keys, specs, live, now_ms, no_replace)
            res.transactions += 1
            res.elements_sent += len(live)
            out = self.sock.transact([x.data for x in msgs] + rules)
            if out.committed:
                res.committed_ops += len(live)
                self._ruled(unruled)
                break
            rule_seqs = {int.from_bytes(r[8:12], "little") for r in rules}
            if rule_retries and any(e.seq in rule_seqs for e in out.errors):
                rule_retries -= 1  # a chain went (its device, on kernels before 6.16): look again, a few times;
                rules = self._rule_msgs(unruled)  # then the error fails the ops, as a batch error does
                continue
            drop, retry_whole = _offenders(out.errors, where, live, names, keys, specs, res, no_replace)
            if not drop and not retry_whole:
                for i in live:
                    res.failed[(names[i], keys[i])] = (E.EIO, "transaction failed without a usable error")
                break
            if drop:
                live = [i for i in live if i not in drop]
        res.seconds = time.perf_counter() - t0
        return res

    def _unruled(self, groups: Sequence[Group]) -> set[str]:
        """Sets this write adds to that have no drop rule yet."""
        if self.filled is None:
            return set()
        return {g.set_name for g in groups if g.keys and g.set_name not in self.filled
                and g.set_name in self._specs and any(s.add for s in g.specs)}

    def _rule_msgs(self, sets: set[str]) -> list[bytes]:
        """The drop rules of `sets` for every planned chain that exists now: they go into the transaction that
        adds the sets' first elements, so no element is ever in a set without its rule."""
        if not sets:
            return []
        present = self.sock.list_chains(self.plan.table)
        rules = rs.rules_for_sets([c for c in self.plan.chains if c.name in present], sets)
        return rs.encode_added_rules(self.plan, rules, self.sock.next_seq(len(rules) + 1))

    def _ruled(self, sets: set[str]) -> None:
        if sets and self.filled is not None:
            self.filled |= sets
            log.debug("drop rules installed for %s", ", ".join(sorted(sets)))

    def drop_idle_rules(self) -> list[str]:
        """Remove the drop rules of sets the kernel counts empty: the chains' rules replaced in one
        transaction (flushed and re-added without them), so the other rules never leave. Returns the sets."""
        if self.filled is None:
            return []
        sets = self.sock.list_sets(self.plan.table)
        idle = {name for name in self.filled if name in sets and sets[name].count == 0}
        if not idle:
            return []
        filled = self.filled - idle
        present = self.sock.list_chains(self.plan.table)
        # the ingress chains as they are, not as the devices say: a skip rule only ever comes with its chain
        attached = {c.device for c in self.plan.chains if c.device is not None and c.name in present}
        chains = [c for c in rs.chains_for(self.plan, attached, filled) if c.name in present]
        out = self.sock.transact(rs.encode_chains(self.plan, chains, self.sock.next_seq(10000)))
        if not out.committed:
            err = out.errors[0]
            log.info("could not drop the rules of empty sets %s (%s); kept", ", ".join(sorted(idle)),
                     KernelError(err.errno, "replacing rules", err.text))
            return []
        self.filled = filled
        return sorted(idle)

    def encode_timed_hosts(self, set_name: str, keys: Sequence[int], until_ms: Sequence[int | None],
                           now_ms: int) -> list[bytes] | None:
        """The element messages of `write_timed_hosts`, or None when these need the general path (no timeout
        updates, an interval set, a permanent ban or an end already past). Reads only what `setup` fixed
        (specs, features, table) and numbers the messages through the socket's locked counter, so a restore
        encodes on the event loop's thread while the kernel thread sends earlier chunks."""
        spec = self._specs.get(set_name)
        if spec is None or spec.interval or not self.features.timeout_update or None in until_ms:
            return None
        remaining = [u - now_ms for u in until_ms]  # type: ignore[operator]  # none is None: checked above
        if min(remaining, default=1) <= 0:
            return None
        return m.timed_hash_messages(m.NFT_MSG_NEWSETELEM, m.NFPROTO_INET, self.plan.table, set_name, keys,
                                     spec.key_len, remaining, self.sock.next_seq(len(keys) + 1), ADD_FLAGS)

    def write_timed_hosts(self, set_name: str, keys: Sequence[int], until_ms: Sequence[int | None],
                          now_ms: int, encoded: list[bytes] | None = None) -> WriteResult:
        """Restored bans, each with its own end, in one transaction of `timed_hash_messages` (one struct pack
        per element; a million restored jail bans have nearly a million different ends, and `write`'s
        per-end templates cost ~3 s for them). Anything unusual (no timeout updates, an interval set, a
        refusal) goes through `write`, which finds and reports the offenders. `encoded`: what
        `encode_timed_hosts` made of the same arguments (None: encode here)."""
        t0 = time.perf_counter()
        msgs = encoded if encoded is not None else self.encode_timed_hosts(set_name, keys, until_ms, now_ms)
        if msgs is None:
            return self._write_timed_general(set_name, keys, until_ms, now_ms)
        if not msgs:
            return WriteResult()
        # the set's first elements bring its drop rule in the same transaction, as in `write`
        unruled = self._unruled([Group(set_name, list(keys[:1]), [OpSpec(True, until_ms[0])])])
        out = self.sock.transact(msgs + self._rule_msgs(unruled))
        if not out.committed:
            return self._write_timed_general(set_name, keys, until_ms, now_ms)
        self._ruled(unruled)
        return WriteResult(committed_ops=len(keys), transactions=1, elements_sent=len(keys),
                           seconds=time.perf_counter() - t0)

    def _write_timed_general(self, set_name: str, keys: Sequence[int], until_ms: Sequence[int | None],
                             now_ms: int) -> WriteResult:
        shared: dict[int | None, OpSpec] = {}
        specs = [shared.get(u) or shared.setdefault(u, OpSpec(True, u)) for u in until_ms]
        return self.write([Group(set_name, list(keys), specs)], now_ms)

    def _write_uniform(self, groups: Sequence[Group], now_ms: int, rules: list[bytes]) -> WriteResult | None:
        """Bulk fast path: every group shares one op (bulk bans, restores, a feed's ranges and its refreshes).

        One transaction, no per-element bookkeeping. Returns None when the path does not apply, or when the
        kernel refused something: the general path then finds the offenders and applies the rest.
        """
        msgs: list[bytes] = []
        n = 0
        del_type = m.NFT_MSG_DESTROYSETELEM if self.features.destroy else m.NFT_MSG_DELSETELEM
        # deletes first, as in the general path (a delete and an add of one key never share a batch here:
        # the batcher coalesces them)
        ordered = sorted(self._ranges_by_spec(groups), key=lambda g: bool(g.specs and g.specs[0].add))
        for g in ordered:
            if not g.keys:
                continue
            spec = self._specs.get(g.set_name)
            s0 = g.specs[0]
            if spec is None or s0.comment:
                return None
            if g.specs.count(s0) != len(g.specs):
                if spec.interval:
                    return None
                part = self._mixed_hash_adds(g, spec, now_ms)
                if part is None:
                    return None
                msgs += part
                n += len(g.keys)
                continue
            if s0.add and s0.existed and not self.features.timeout_update:
                return None  # refresh needs destroy + add: the general path does it
            if not s0.add and not self.features.destroy:
                return None  # plain DELSETELEM fails on absent elements: the general path drops them
            timeout = None
            if s0.add and s0.until_ms is not None:
                timeout = s0.until_ms - now_ms
                if timeout <= 0:
                    return None
            msg_type = m.NFT_MSG_NEWSETELEM if s0.add else del_type
            flags = ADD_FLAGS if s0.add else m.NLM_F_REQUEST
            if spec.interval:  # ranges (a feed's sets): the tail `_encode_elements` gives them
                tail = m.element_tail(timeout, self.features.timeout_update) if s0.add else b""
                msgs += m.uniform_range_messages(msg_type, m.NFPROTO_INET, self.plan.table, g.set_name, g.keys,
                                                 spec.key_len, tail, self.sock.next_seq(len(g.keys) + 1), flags)
                n += len(g.keys)
                continue
            msgs += m.uniform_hash_messages(msg_type, m.NFPROTO_INET, self.plan.table, g.set_name, g.keys,
                                            spec.key_len, timeout, self.features.timeout_update and s0.add,
                                            self.sock.next_seq(len(g.keys) + 1), flags)
            n += len(g.keys)
        if not msgs:
            return None
        out = self.sock.transact(msgs + rules)
        if not out.committed:
            return None
        return WriteResult(committed_ops=n, transactions=1, elements_sent=n)

    def _ranges_by_spec(self, groups: Sequence[Group]) -> list[Group]:
        """Each interval-set group whose ops differ cut into one group per distinct op (in first-seen order,
        keys in order), so that they too take the uniform path: the IPv6 /64 bans of a burst's merged batches
        have a few different ends, and one such range group sent every op of the write, the burst's IPv4
        hosts included, through the general path's per-element encoding (10k ops: ~10 ms of the kernel
        thread's Python on this VM, holding the GIL the event loop needs). A refused transaction still ends
        in the general path, which finds the offenders."""
        out: list[Group] = []
        for g in groups:
            spec = self._specs.get(g.set_name)
            specs = g.specs
            if spec is None or not spec.interval or not specs or isinstance(specs, TimedSpecs) or \
                    specs.count(specs[0]) == len(specs):
                out.append(g)
                continue
            parts: dict[OpSpec, list[int]] = {}
            for k, op in zip(g.keys, specs, strict=True):
                same = parts.get(op)
                if same is None:
                    parts[op] = [k]
                else:
                    same.append(k)
            out += [Group(g.set_name, ks, [op] * len(ks)) for op, ks in parts.items()]
        return out

    def _mixed_hash_adds(self, g: Group, spec: rs.SetSpec, now_ms: int) -> list[bytes] | None:
        """Hash-set adds whose ends differ (restored bans, a fleet catch-up's jail bans): `timed_hash_messages`,
        one struct pack per element, the specs read a column at a time (a template and a dict look-up per
        distinct end were most of the kernel thread's encoding when every end differs)."""
        if not self.features.timeout_update:
            return None  # equal element lengths need EXPIRATION on every element (refresh form)
        specs = g.specs
        ends: list[int]
        if isinstance(specs, TimedSpecs):  # the column itself: adds, no comment, none permanent
            ends = specs.ends_ms
        else:
            if not all(map(_ADD, specs)) or any(map(_COMMENT, specs)):
                return None
            untils = list(map(_UNTIL_MS, specs))
            if None in untils:
                return None
            ends = cast("list[int]", untils)
        remaining = list(map(operator.sub, ends, itertools.repeat(now_ms)))
        if min(remaining, default=1) <= 0:
            return None
        return m.timed_hash_messages(m.NFT_MSG_NEWSETELEM, m.NFPROTO_INET, self.plan.table, g.set_name, g.keys,
                                     spec.key_len, remaining, self.sock.next_seq(len(g.keys) + 1), ADD_FLAGS)

    def _encode(self, names: list[str], keys: list[int], specs: list[OpSpec], live: Sequence[int], now_ms: int,
                no_replace: set[int]) -> tuple[list[m.SetMessage], dict[int, _Where]]:
        """Messages for the live ops: per set, deletes (destroys) first, then adds."""
        by_set: dict[str, tuple[list[int], list[int]]] = {}
        refresh_by_replace = not self.features.timeout_update
        for i in live:
            spec = specs[i]
            dels, adds = by_set.setdefault(names[i], ([], []))
            if spec.add:
                adds.append(i)
                if spec.existed and refresh_by_replace and i not in no_replace:
                    dels.append(i)
            else:
                dels.append(i)
        msgs: list[m.SetMessage] = []
        where: dict[int, _Where] = {}
        del_type = m.NFT_MSG_DESTROYSETELEM if self.features.destroy else m.NFT_MSG_DELSETELEM
        refresh = self.features.timeout_update
        for name, (dels, adds) in by_set.items():
            set_spec = self._specs[name]
            for msg_type, ids, flags in ((del_type, dels, m.NLM_F_REQUEST), (m.NFT_MSG_NEWSETELEM, adds,
                                                                                  ADD_FLAGS)):
                if not ids:
                    continue
                adding = msg_type == m.NFT_MSG_NEWSETELEM
                encoded = self._encode_elements(set_spec, keys, specs, ids, now_ms if adding else None, refresh)
                parts = m.split_set_messages(msg_type, m.NFPROTO_INET, self.plan.table, name, encoded,
                                             self.sock.next_seq(len(encoded) + 1), flags)
                for sm in parts:
                    seq = int.from_bytes(sm.data[8:12], "little")
                    where[seq] = (sm, ids, not adding)
                msgs += parts
        return msgs, where

    def _encode_elements(self, spec: rs.SetSpec, keys: list[int], specs: list[OpSpec], ids: Sequence[int],
                         now_ms: int | None, refresh: bool) -> list[bytes]:
        v = spec.version
        klen = 4 if v == 4 else 16

        def tmo(s: OpSpec) -> int | None:
            return None if now_ms is None or s.until_ms is None else s.until_ms - now_ms

        if not spec.interval:
            if all(not specs[i].comment for i in ids) or now_ms is None:
                cache: dict[int, int | None] = {}  # shared spec objects: compute each timeout once
                tmos = []
                for i in ids:
                    s = specs[i]
                    t = cache.get(id(s), -1)
                    if t == -1:
                        t = cache[id(s)] = tmo(s)
                    tmos.append(t)
                return m.encode_hash_elements([keys[i].to_bytes(klen, "big") for i in ids], tmos, refresh)
            return [m.encode_element(m.Element(keys[i].to_bytes(klen, "big"), tmo(specs[i]), refresh,
                                               specs[i].comment)) for i in ids]
        # ranges: straight from the integer key, one tail per distinct op (ipaddress objects cost ~25x more)
        bits = klen * 8
        top = 1 << bits
        tails: dict[int, bytes] = {}
        out = []
        for i in ids:
            k = keys[i]
            s = specs[i]
            tail = tails.get(id(s))
            if tail is None:
                tail = tails[id(s)] = m.element_tail(tmo(s), refresh and now_ms is not None,
                                                     s.comment if now_ms is not None else "")
            start = k >> 8  # addr's net key, decoded inline: this runs per range element
            end = start + (1 << (bits - (k & 0xFF)))
            out.append(m.encode_range(start.to_bytes(klen, "big"), end.to_bytes(klen, "big") if end < top else None,
                                      tail))
        return out

    # -- verification ---------------------------------------------------------------------------------

    @property
    def last_generation(self) -> int:
        return self.sock.generation

    def generation(self) -> int:
        return self.sock.get_generation()

    def table_intact(self) -> list[str]:
        """What is missing from our table (empty list = intact). Cheap: a few small GET/dump requests."""
        exists, _flags = self.sock.table_exists(self.plan.table)
        if not exists:
            return [f"table inet {self.plan.table}"]
        missing = []
        sets = self.sock.list_sets(self.plan.table)
        missing += [f"set {s.name}" for s in self.plan.sets if s.name not in sets]
        chains = self.sock.list_chains(self.plan.table)
        for c in self.chains():
            if c.name not in chains:
                missing.append(f"chain {c.name}")
            elif self.sock.count_rules(self.plan.table, c.name) != len(c.rules):
                missing.append(f"rules of chain {c.name}")
        return missing

    def set_counts(self) -> dict[str, int | None]:
        sets = self.sock.list_sets(self.plan.table)
        return {name: (sets[name].count if name in sets else None) for name in self._specs}

    def dump_keys(self, set_name: str) -> dict[int, int | None]:
        """key -> remaining ms (None = permanent) as the kernel holds it; interval sets give range keys."""
        spec = self._specs[set_name]
        elems = self.sock.dump_elements(self.plan.table, set_name)
        out: dict[int, int | None] = {}
        if not spec.interval:
            for e in elems:
                out[int.from_bytes(e.key, "big")] = e.expiration_ms
            return out
        bits = 32 if spec.version == 4 else 128
        starts = sorted((int.from_bytes(e.key, "big"), e.flags & m.NFT_SET_ELEM_INTERVAL_END, e.expiration_ms)
                        for e in elems)
        pending: tuple[int, int | None] | None = None
        for addr, is_end, exp in starts:
            if is_end:
                if pending is not None:
                    out.update(_cidr_keys(pending[0], addr - 1, bits, pending[1]))
                    pending = None
            else:
                if pending is not None:  # a start without an end runs to the top of the space
                    out.update(_cidr_keys(pending[0], addr - 1, bits, pending[1]))
                pending = (addr, exp)
        if pending is not None:
            out.update(_cidr_keys(pending[0], (1 << bits) - 1, bits, pending[1]))
        return out

    def close(self) -> None:
        self.sock.close()
        if self._links is not None:
            self._links.close()


def _cidr_keys(first: int, last: int, bits: int, exp: int | None) -> dict[int, int | None]:
    cls = ipaddress.IPv4Address if bits == 32 else ipaddress.IPv6Address
    return {net_key(n): exp for n in ipaddress.summarize_address_range(cls(first), cls(last))}


def _interval_element(net: IPNet, timeout_ms: int | None, comment: str, refresh: bool = False) -> m.Element:
    end_int = int(net.broadcast_address) + 1
    bits = net.max_prefixlen
    end = end_int.to_bytes(bits // 8, "big") if end_int < (1 << bits) else None
    return m.Element(net.network_address.packed, timeout_ms, refresh, comment, end, True)


def _offenders(errors: Sequence[m.ErrorReply], where: dict[int, _Where], live: list[int], names: list[str],
               keys: list[int], specs: list[OpSpec], res: WriteResult, no_replace: set[int]
               ) -> tuple[set[int], bool]:
    """Read a refused transaction's errors: the ops to leave out of the next attempt (recorded in
    `res.failed`, or counted as done), and whether the rest is worth sending again as it is.

    A delete that found nothing is done (a delete wanted it gone) or, as the first half of a refresh, becomes
    a plain add (`no_replace`). An error on the batch itself fails every live op unless it is transient.
    """
    drop: set[int] = set()
    retry_whole = False
    full: dict[int, tuple[list[int], int]] = {}  # id(a set's add list) -> (that list, first refused position)
    for err in errors:
        hit = where.get(err.seq)
        if hit is None:  # error on BATCH_BEGIN/END: the commit itself failed
            if err.errno in (E.ERESTART, E.ENOBUFS, E.EINTR, E.EAGAIN, E.EBUSY):
                retry_whole = True
                continue
            for i in live:
                res.failed[(names[i], keys[i])] = (err.errno, err.text or "transaction refused")
            drop.update(live)
            continue
        msg, op_ids, is_delete = hit
        j = bisect.bisect_right(msg.offsets, err.offset) - 1 if err.offset is not None else -1
        if j < 0:
            # the message itself is bad (usually: the set is gone): every op in it fails this round
            in_msg = [op_ids[k] for k in msg.op_index]
            if err.errno == E.ENOENT:
                res.missing_sets.add(names[in_msg[0]])
            for i in in_msg:
                res.failed[(names[i], keys[i])] = (err.errno, err.text or "set refused the message")
            drop.update(in_msg)
            continue
        i = op_ids[msg.op_index[j]]
        if err.errno == E.ENOENT and is_delete:
            if specs[i].add:
                no_replace.add(i)  # the old element expired meanwhile: a plain add will do
                retry_whole = True
            else:
                drop.add(i)  # already gone: that is what a delete wanted
                res.committed_ops += 1
            continue
        res.failed[(names[i], keys[i])] = (err.errno, err.text)
        drop.add(i)
        if err.errno == E.ENFILE and not is_delete:
            p = msg.op_index[j]
            seen = full.get(id(op_ids))
            if seen is None or p < seen[1]:
                full[id(op_ids)] = (op_ids, p)
    for op_ids, p in full.values():
        # The set is full from this add on. A set's deletes go before its adds (`_encode`), so nothing later in
        # the transaction frees a slot: every later add of an element that is certainly new is refused as well.
        # The kernel reports one error per message, so without this a `ban -` of 300k addresses into a
        # 262,144-element set found its 37,856 refusals ~50 per transaction of 100k elements: minutes of
        # transactions while the CLI waited. Adds that may refresh an existing element are sent again.
        err_text = res.failed[(names[op_ids[p]], keys[op_ids[p]])][1]
        for q in op_ids[p + 1:]:
            if not specs[q].existed and q not in drop:
                res.failed[(names[q], keys[q])] = (E.ENFILE, err_text)
                drop.add(q)
    return drop, retry_whole
