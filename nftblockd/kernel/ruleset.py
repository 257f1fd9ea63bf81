"""The kernel objects nftblockd owns, planned from the config, rendered as nft text and encoded for netlink.

Pure: `plan_ruleset(cfg)` returns values; `encode_ruleset(...)` returns message bytes. The rules exist once, as
data (`RuleSpec`), so the netlink encoding, the README's `nft list` view and the tests all derive from the same
plan instead of strings scattered around.

Layout of table `inet nftblock` (names derived from the blocklist name):
  set allow_net4 / allow_net6      interval, the allowlist
  set <bl>_ip4 / <bl>_ip6          hash + timeout: exact addresses, O(1) per packet
  set <bl>_net4 / <bl>_net6        interval + timeout: CIDR ranges
  chain prerouting                 hook prerouting priority raw: sees forwarded traffic too (containers, VMs)
  chain ingress_<dev>              optional, hook ingress on named devices: drops before anything else

One rule per blocklist set: `ip saddr @<bl>_ip4 ip saddr != @allow_net4 counter drop`. The allowlist is
looked up only after a ban matched, so an innocent packet pays one lookup per blocklist set and nothing for
the allowlist (before, `ip saddr @allow_net4 accept` came first and every packet paid for it). A set lookup
costs 50-130 ns even in a tiny or empty set, against ~10 ns for a plain compare: the number of lookups an
innocent packet makes is the data path's cost (docs/datapath.md has the measurements and the layouts tried).

So a set's rule is installed only while the set may hold elements (`chains_for(..., filled)`): the plan
holds every rule, and the writer decides which sets are filled. Its rules for that:
  * at setup (start, reload, rebuild) a set is filled when the kernel counts elements in it, or gives no
    count (a kernel without NFTA_SET_COUNT: filled, to be safe);
  * the first add to a set without its rule carries the rule in the same transaction as the elements: no
    element is ever in a set whose rule is missing, so nothing passes unfiltered;
  * a rule on a set that became empty is dropped lazily (`drop_idle_rules`, at reconcile) or at the next
    setup; until then it only costs the lookup.
A feed-owned blocklist keeps its single addresses in its interval sets, as /32 or /128 ranges (the feed
manager does that): its hash sets stay empty and so have no rule, one lookup less per packet.

What this module must not do: talk to the kernel, or decide which devices exist (the writer asks, and passes
the answer to `chains_for`).
"""

from __future__ import annotations

import struct
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace

from nftblockd.config import Config
from nftblockd.kernel import nfmsg as m

ALLOW = "allow"


@dataclass(frozen=True, slots=True)
class SetSpec:
    name: str
    version: int  # 4 or 6
    interval: bool
    timeout: bool
    size: int | None
    blocklist: str | None  # None for the allowlist sets

    @property
    def key_len(self) -> int:
        return 4 if self.version == 4 else 16

    @property
    def flags(self) -> int:
        return (m.NFT_SET_INTERVAL if self.interval else 0) | (m.NFT_SET_TIMEOUT if self.timeout else 0)

    @property
    def kind(self) -> str:
        return "interval" if self.interval else "hash"


@dataclass(frozen=True, slots=True)
class RuleSpec:
    """`<family> saddr @set_name [<family> saddr != @unless] [counter] verdict comment "comment"`."""

    version: int
    set_name: str
    verdict: str  # "accept" | "drop"
    counter: bool
    comment: str
    unless: str | None = None  # a set looked up only after a match: a source in it is let through


@dataclass(frozen=True, slots=True)
class SkipSpec:
    """`iifname "<device>" return`: a packet that came in on a device with an ingress chain of ours was
    checked there already; the base chain lets it go on without looking it up a second time."""

    device: str
    comment: str = "nftblockd: checked at ingress"


@dataclass(frozen=True, slots=True)
class ChainSpec:
    name: str
    hook: str
    priority: int
    device: str | None
    rules: tuple[RuleSpec | SkipSpec, ...]

    @property
    def hook_key(self) -> m.ChainHook:
        return m.ChainHook(m.HOOKS[self.hook], self.priority, self.device)


@dataclass(frozen=True, slots=True)
class Ruleset:
    table: str
    sets: tuple[SetSpec, ...]
    chains: tuple[ChainSpec, ...]

    def set(self, name: str) -> SetSpec:
        for s in self.sets:
            if s.name == name:
                return s
        raise KeyError(name)


def set_name(blocklist: str, version: int, interval: bool) -> str:
    return f"{blocklist}_{'net' if interval else 'ip'}{version}"


INGRESS_PRIORITY = -500
INGRESS_PREFIX = "ingress_"


def ingress_chain_name(device: str) -> str:
    return f"{INGRESS_PREFIX}{device}"


def plan_ruleset(cfg: Config) -> Ruleset:
    sets: list[SetSpec] = [SetSpec(set_name(ALLOW, v, True), v, True, False, None, None) for v in (4, 6)]
    for bl in cfg.blocklists:
        for interval in (False, True):
            for v in (4, 6):
                sets.append(SetSpec(set_name(bl.name, v, interval), v, interval, True, bl.size, bl.name))
    rules = tuple(RuleSpec(s.version, s.name, "drop", True, f"nftblockd blocklist {s.blocklist}",
                           unless=set_name(ALLOW, s.version, True)) for s in sets if s.blocklist is not None)
    chains = [ChainSpec(cfg.chain.hook, cfg.chain.hook, cfg.chain.priority, None, rules)]
    chains += [ChainSpec(ingress_chain_name(dev), "ingress", INGRESS_PRIORITY, dev, rules)
               for dev in cfg.chain.ingress]
    return Ruleset(cfg.table, tuple(sets), tuple(chains))


def chains_for(rs: Ruleset, present: Collection[str], filled: Collection[str] | None = None
               ) -> tuple[ChainSpec, ...]:
    """The chains to install: every chain without a device, and the ingress chains whose device exists;
    with `filled`, only the drop rules of the sets named there (None: every rule).

    An ingress chain is installed only while its device exists, on every kernel: before 6.16 the kernel
    refuses a chain for a missing device and deletes one whose device goes away; from 6.16 on it keeps it
    detached. The base chain filters that device's packets whenever its ingress chain is not installed, and
    skips them (`SkipSpec`, first) while it is: installed together, in one transaction, the two never
    disagree, and an innocent packet is looked up once, not at both hooks."""
    chains = rs.chains
    if filled is not None:
        chains = tuple(replace(c, rules=tuple(r for r in c.rules if isinstance(r, SkipSpec)
                                              or r.set_name in filled)) for c in chains)
    ingress = [c for c in chains if c.device is not None and c.device in present]
    skips = tuple(SkipSpec(c.device) for c in ingress if c.device is not None)
    base = [replace(c, rules=skips + c.rules) for c in chains if c.device is None]
    return (*base, *ingress)


def rules_for_sets(chains: Sequence[ChainSpec], sets: Collection[str]) -> list[tuple[str, RuleSpec]]:
    """(chain, rule) for every drop rule on one of `sets` in `chains`: what a set's first element brings."""
    return [(c.name, r) for c in chains for r in c.rules if isinstance(r, RuleSpec) and r.set_name in sets]


def chain_changes(wanted: Sequence[ChainSpec], existing: Mapping[str, m.ChainHook | None]) -> list[str]:
    """Chains of our table to delete before (re)creating `wanted`, in the same transaction: the ones we no
    longer want (an ingress device removed from the config, or gone; an old hook), and the ones attached
    elsewhere than planned (the kernel cannot move a chain to another priority: it is deleted and made again).
    `existing` maps our table's chains to their hooks (None: a regular chain)."""
    want = {c.name: c.hook_key for c in wanted}
    return sorted(name for name, hook in existing.items() if name not in want or want[name] != hook)


# --- rendering (documentation, `nftblock ruleset`, tests) ----------------------------------------------

_PRIORITY_NAMES = {-300: "raw", -150: "mangle", -100: "dstnat", 0: "filter", 50: "security"}

def render_nft(rs: Ruleset) -> str:
    lines = [f"table inet {rs.table} {{"]
    for s in rs.sets:
        lines.append(f"\tset {s.name} {{")
        lines.append(f"\t\ttype {'ipv4_addr' if s.version == 4 else 'ipv6_addr'}")
        flags = [f for f, on in (("interval", s.interval), ("timeout", s.timeout)) if on]
        if flags:
            lines.append(f"\t\tflags {','.join(flags)}")
        if s.size:
            lines.append(f"\t\tsize {s.size}")
        lines.append("\t}")
    for c in rs.chains:
        lines.append(f"\tchain {c.name} {{")
        dev = f" device \"{c.device}\"" if c.device else ""
        prio = _PRIORITY_NAMES.get(c.priority, str(c.priority)) if c.hook != "ingress" else str(c.priority)
        lines.append(f"\t\ttype filter hook {c.hook}{dev} priority {prio}; policy accept;")
        lines += [f"\t\t{render_rule(r)}" for r in c.rules]
        lines.append("\t}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def render_rule(r: RuleSpec | SkipSpec) -> str:
    if isinstance(r, SkipSpec):
        return f'iifname "{r.device}" return comment "{r.comment}"'
    proto = "ip" if r.version == 4 else "ip6"
    unless = f" {proto} saddr != @{r.unless}" if r.unless else ""
    counter = " counter" if r.counter else ""
    return f"{proto} saddr @{r.set_name}{unless}{counter} {r.verdict} comment \"{r.comment}\""


# --- netlink encoding ---------------------------------------------------------------------------------

def _expr(name: str, *data: bytes) -> bytes:
    return m.nest(m.NFTA_LIST_ELEM, m.strz(m.NFTA_EXPR_NAME, name), m.nest(m.NFTA_EXPR_DATA, *data))


def skip_expressions(r: SkipSpec) -> bytes:
    """`iifname "<device>" return`, as nft encodes it: the name compared as 16 bytes (IFNAMSIZ)."""
    name = r.device.encode().ljust(16, b"\0")
    return m.nest(m.NFTA_RULE_EXPRESSIONS,
                  _expr("meta", m.be32(1, m.NFT_REG_1), m.be32(2, m.NFT_META_IIFNAME)),
                  _expr("cmp", m.be32(1, m.NFT_REG_1), m.be32(2, 0), m.nest(3, m.attr(m.NFTA_DATA_VALUE, name))),
                  _expr("immediate", m.be32(1, m.NFT_REG_VERDICT),
                        m.nest(2, m.nest(m.NFTA_DATA_VERDICT, m.be32(m.NFTA_VERDICT_CODE, m.NFT_RETURN & 0xFFFFFFFF)))))


def rule_expressions(r: RuleSpec, set_id: int, unless_id: int = 0) -> bytes:
    """The rule as nft itself encodes it (so `nft list` shows it as `render_rule` writes it): the family
    check, the source address loaded, the lookup; for `unless`, the address loaded again and an inverted
    lookup (NFT_LOOKUP_F_INV), reached only by packets that matched."""
    nfproto = m.NFPROTO_IPV4 if r.version == 4 else m.NFPROTO_IPV6
    offset, length = (12, 4) if r.version == 4 else (8, 16)
    saddr = _expr("payload", m.be32(1, m.NFT_REG_1), m.be32(2, 1), m.be32(3, offset), m.be32(4, length))
    exprs = [
        _expr("meta", m.be32(1, m.NFT_REG_1), m.be32(2, 15)),  # meta load nfproto => reg 1
        _expr("cmp", m.be32(1, m.NFT_REG_1), m.be32(2, 0), m.nest(3, m.attr(m.NFTA_DATA_VALUE, bytes([nfproto])))),
        saddr,
        _expr("lookup", m.strz(1, r.set_name), m.be32(2, m.NFT_REG_1), m.be32(4, set_id)),
    ]
    if r.unless:
        exprs += [saddr, _expr("lookup", m.strz(1, r.unless), m.be32(2, m.NFT_REG_1), m.be32(4, unless_id),
                               m.be32(m.NFTA_LOOKUP_FLAGS, m.NFT_LOOKUP_F_INV))]
    if r.counter:
        exprs.append(_expr("counter", m.be64(1, 0), m.be64(2, 0)))
    code = m.NF_ACCEPT if r.verdict == "accept" else m.NF_DROP
    exprs.append(_expr("immediate", m.be32(1, m.NFT_REG_VERDICT),
                       m.nest(2, m.nest(m.NFTA_DATA_VERDICT, m.be32(m.NFTA_VERDICT_CODE, code)))))
    return m.nest(m.NFTA_RULE_EXPRESSIONS, *exprs)


def encode_table(table: str, flags: int, seq: int) -> bytes:
    body = m.strz(m.NFTA_TABLE_NAME, table) + m.be32(m.NFTA_TABLE_FLAGS, flags)
    return m.message(m.NFT_MSG_NEWTABLE, m.NLM_F_REQUEST | m.NLM_F_CREATE, seq, m.NFPROTO_INET, body)


def encode_set(table: str, s: SetSpec, set_id: int, seq: int) -> bytes:
    body = (m.strz(m.NFTA_SET_TABLE, table) + m.strz(m.NFTA_SET_NAME, s.name)
            + m.be32(m.NFTA_SET_FLAGS, s.flags) + m.be32(m.NFTA_SET_KEY_TYPE,
                                                        m.TYPE_IPADDR if s.version == 4 else m.TYPE_IP6ADDR)
            + m.be32(m.NFTA_SET_KEY_LEN, s.key_len) + m.be32(m.NFTA_SET_ID, set_id)
            + m.attr(m.NFTA_SET_USERDATA, bytes((m.NFTNL_UDATA_SET_KEYBYTEORDER, 4))
                     + struct.pack("=I", m.NFT_BYTEORDER_BIG_ENDIAN)))
    if s.size:
        body += m.nest(m.NFTA_SET_DESC, m.be32(m.NFTA_SET_DESC_SIZE, s.size))
    return m.message(m.NFT_MSG_NEWSET, m.NLM_F_REQUEST | m.NLM_F_CREATE, seq, m.NFPROTO_INET, body)


def encode_chain(table: str, c: ChainSpec, seq: int) -> bytes:
    hook = m.be32(m.NFTA_HOOK_HOOKNUM, m.HOOKS[c.hook]) + m.be32(m.NFTA_HOOK_PRIORITY, c.priority & 0xFFFFFFFF)
    if c.device:
        hook += m.strz(m.NFTA_HOOK_DEV, c.device)
    body = (m.strz(m.NFTA_CHAIN_TABLE, table) + m.strz(m.NFTA_CHAIN_NAME, c.name)
            + m.nest(m.NFTA_CHAIN_HOOK, hook) + m.be32(m.NFTA_CHAIN_POLICY, m.NF_ACCEPT)
            + m.strz(m.NFTA_CHAIN_TYPE, "filter"))
    return m.message(m.NFT_MSG_NEWCHAIN, m.NLM_F_REQUEST | m.NLM_F_CREATE, seq, m.NFPROTO_INET, body)


def encode_flush_chain(table: str, chain: str, seq: int) -> bytes:
    body = m.strz(m.NFTA_RULE_TABLE, table) + m.strz(m.NFTA_RULE_CHAIN, chain)
    return m.message(m.NFT_MSG_DELRULE, m.NLM_F_REQUEST, seq, m.NFPROTO_INET, body)


def encode_del_chain(table: str, chain: str, seq: int) -> bytes:
    """Delete a chain and its rules."""
    body = m.strz(m.NFTA_CHAIN_TABLE, table) + m.strz(m.NFTA_CHAIN_NAME, chain)
    return m.message(m.NFT_MSG_DELCHAIN, m.NLM_F_REQUEST, seq, m.NFPROTO_INET, body)


def encode_rule(table: str, chain: str, r: RuleSpec | SkipSpec, set_id: int, seq: int, unless_id: int = 0) -> bytes:
    exprs = skip_expressions(r) if isinstance(r, SkipSpec) else rule_expressions(r, set_id, unless_id)
    body = (m.strz(m.NFTA_RULE_TABLE, table) + m.strz(m.NFTA_RULE_CHAIN, chain) + exprs
            + m.attr(m.NFTA_RULE_USERDATA, m.comment_udata(m.NFTNL_UDATA_RULE_COMMENT, r.comment)))
    return m.message(m.NFT_MSG_NEWRULE, m.NLM_F_REQUEST | m.NLM_F_CREATE | m.NLM_F_APPEND, seq, m.NFPROTO_INET,
                     body)


def encode_flush_set(table: str, set_name_: str, seq: int) -> bytes:
    """DELSETELEM without ELEMENTS flushes the set: used only for the allowlist, replaced in the same batch."""
    body = m.strz(m.NFTA_SET_ELEM_LIST_TABLE, table) + m.strz(m.NFTA_SET_ELEM_LIST_SET, set_name_)
    return m.message(m.NFT_MSG_DELSETELEM, m.NLM_F_REQUEST, seq, m.NFPROTO_INET, body)


def encode_del_set(table: str, set_name_: str, seq: int) -> bytes:
    body = m.strz(m.NFTA_SET_TABLE, table) + m.strz(m.NFTA_SET_NAME, set_name_)
    return m.message(m.NFT_MSG_DELSET, m.NLM_F_REQUEST, seq, m.NFPROTO_INET, body)


def encode_ruleset(rs: Ruleset, table_flags: int, seq: int, stale_sets: Sequence[str] = (), *,
                   chains: Sequence[ChainSpec] | None = None, delete_chains: Sequence[str] = ()) -> list[bytes]:
    """Messages (without batch markers) that create or update everything in one transaction.

    `chains` (default: all of the plan's) are created or kept, their rules flushed and re-added in the same
    transaction, so a restart or reload never leaves a moment without them, and never duplicates them.
    `delete_chains` go first (a chain deleted and made again in one transaction is how it moves to another
    priority), stale sets last (a set can only go once no rule refers to it).
    """
    msgs = [encode_table(rs.table, table_flags, seq)]
    for i, s in enumerate(rs.sets, start=1):
        msgs.append(encode_set(rs.table, s, i, seq + len(msgs)))
    msgs += encode_chains(rs, rs.chains if chains is None else chains, seq + len(msgs),
                          delete_chains=delete_chains)
    for name in stale_sets:
        msgs.append(encode_del_set(rs.table, name, seq + len(msgs)))
    return msgs


def encode_added_rules(rs: Ruleset, rules: Sequence[tuple[str, RuleSpec]], seq: int) -> list[bytes]:
    """Append drop rules to existing chains (after the skip rules, which come first): sets named by name
    and by their plan position, as `encode_chains` does."""
    set_ids = {s.name: i for i, s in enumerate(rs.sets, start=1)}
    return [encode_rule(rs.table, chain, r, set_ids[r.set_name], seq + i, set_ids[r.unless] if r.unless else 0)
            for i, (chain, r) in enumerate(rules)]


def encode_chains(rs: Ruleset, chains: Sequence[ChainSpec], seq: int, *,
                  delete_chains: Sequence[str] = ()) -> list[bytes]:
    """Delete `delete_chains`, then create (or keep) `chains` with exactly their rules. Sets are named by
    name and by their position in the plan (the NFTA_SET_ID of encode_ruleset, for sets made in the same
    transaction)."""
    set_ids = {s.name: i for i, s in enumerate(rs.sets, start=1)}
    msgs = [encode_del_chain(rs.table, name, seq + i) for i, name in enumerate(delete_chains)]
    for c in chains:
        msgs.append(encode_chain(rs.table, c, seq + len(msgs)))
        msgs.append(encode_flush_chain(rs.table, c.name, seq + len(msgs)))
        for r in c.rules:
            if isinstance(r, SkipSpec):
                msgs.append(encode_rule(rs.table, c.name, r, 0, seq + len(msgs)))
            else:
                msgs.append(encode_rule(rs.table, c.name, r, set_ids[r.set_name], seq + len(msgs),
                                        set_ids[r.unless] if r.unless else 0))
    return msgs
