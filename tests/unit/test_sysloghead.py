"""sysloghead: when a prefix is the built-in syslog header, and the texts a plain regex names, in the order a
backtracking engine tries them (held to `re` itself by hypothesis)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nftblockd.detect.filterload import load_yaml_filter
from nftblockd.detect.sysloghead import MAX_TEXTS, SYSLOG, daemon_names, literal_texts, syslog_head
from tests.unit.test_native import FILTERS


@pytest.mark.parametrize(("regex", "texts"), [
    ("sshd", ("sshd",)),
    ("sshd(?:-session|-auth)?", ("sshd-session", "sshd-auth", "sshd")),
    ("(?:(?:error|fatal): (?:PAM: )?)?", ("error: PAM: ", "error: ", "fatal: PAM: ", "fatal: ", "")),
    ("a(?:|b)", ("a", "ab")),  # the empty branch first: the engine tries "a" first
    ("a\\-b\\.", ("a-b.",)),
    ("(?:a|a)", ("a",)),
    ("", ("",)),
])
def test_literal_texts_in_the_engines_order(regex: str, texts: tuple[str, ...]) -> None:
    assert literal_texts(regex) == texts


@pytest.mark.parametrize("regex", [
    r"\S+", r"a.b", r"a*", r"a+", r"a{2}", r"a??", r"a?+", r"[ab]", r"(a)", r"(?P<x>a)", r"(?i:a)", r"(?=a)",
    r"^a", r"a$", r"\d", r"\1", r"a)", r"(?:a", r"<HOST>", r"a|b(", "é", r"\x41",
    "(?:a|b)(?:a|b)(?:a|b)(?:a|b)(?:a|b)(?:a|b)",  # 64 texts: more than MAX_TEXTS
])
def test_literal_texts_refuses_what_is_not_plain(regex: str) -> None:
    assert literal_texts(regex) is None


def test_daemon_names_are_plain_program_names() -> None:
    assert daemon_names("sshd(?:-session|-auth)?") == ("sshd", "sshd-auth", "sshd-session")
    assert daemon_names("(?:nftblockd|fail2ban\\.actions)") is None  # "." can end a host, not a name here
    assert daemon_names("(?:a|)") == ("a",)
    assert daemon_names("(?:|)") is None
    assert daemon_names("a b") is None
    assert daemon_names(r"\S+") is None


def test_the_sshd_filters_prefix_is_the_header_and_its_tail() -> None:
    for mode in ("normal", "aggressive"):
        text = load_yaml_filter(FILTERS / "sshd.yaml", {"mode": mode}).prefix
        assert text is not None
        assert syslog_head(text.text) == (("sshd", "sshd-auth", "sshd-session"),
                                          ("error: PAM: ", "error: ", "fatal: PAM: ", "fatal: ", ""))


@pytest.mark.parametrize("prefix", [
    "<syslog>",  # no F-MLFID around it
    "<F-MLFID>" + SYSLOG.replace("<daemon>", "sshd") + "</F-MLFID>",  # the one taken: the fragment itself
    "x<F-MLFID>" + SYSLOG.replace("<daemon>", "sshd") + "</F-MLFID>",
    "<F-MLFID>" + SYSLOG.replace("<daemon>", r"\S+") + "</F-MLFID>",
    "<F-MLFID>" + SYSLOG.replace("<daemon>", "sshd") + "</F-MLFID><HOST> ",
    "<F-MLFID>" + SYSLOG.replace("<daemon>", "sshd").replace(r"\s+(?:\[ID", r"\s*(?:\[ID") + "</F-MLFID>",
])
def test_syslog_head_takes_only_the_fragment_itself(prefix: str) -> None:
    expected = prefix == "<F-MLFID>" + SYSLOG.replace("<daemon>", "sshd") + "</F-MLFID>"
    assert (syslog_head(prefix) is not None) == expected


# -- literal_texts against `re` --------------------------------------------------------------------------

_char = st.sampled_from(["a", "b", "-", ":", " ", "\\-", "\\.", "\\["])


def _group(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.builds(lambda alts, opt: f"(?:{'|'.join(alts)}){'?' if opt else ''}",
                     st.lists(inner, min_size=1, max_size=3), st.booleans())


_regex = st.recursive(st.lists(_char, max_size=3).map("".join),
                      lambda inner: st.lists(st.one_of(_char, _group(inner)), max_size=3).map("".join),
                      max_leaves=8)


@settings(max_examples=400, deadline=None)
@given(_regex, st.lists(st.sampled_from(["a", "b", "-", ":", " ", ".", "[", "x"]), max_size=6).map("".join))
def test_the_first_text_a_subject_starts_with_is_res_match(regex: str, tail: str) -> None:
    texts = literal_texts(regex)
    if texts is None:
        return
    assert len(texts) <= MAX_TEXTS
    rx = re.compile(regex)
    for text in texts:
        assert rx.fullmatch(text), (regex, text)
        subject = text + tail
        first = next(t for t in texts if subject.startswith(t))
        m = rx.match(subject)
        assert m is not None and m.group() == first, (regex, subject, first)
