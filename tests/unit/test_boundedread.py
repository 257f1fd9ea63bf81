"""Files named by an operator are read bounded: regular files only, a size cap, never a wait (issue 33)."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from nftblockd import boundedread
from nftblockd.boundedread import BoundedReadError
from nftblockd.config import examine_config
from nftblockd.detect.f2b import read_filter
from nftblockd.detect.filterload import load_filter
from nftblockd.detect.matcher import FilterError


def test_a_regular_file_within_the_cap_is_read_whole(tmp_path: Path) -> None:
    p = tmp_path / "f"
    p.write_bytes(b"x" * 100)
    assert boundedread.read_bytes(p, 100) == b"x" * 100
    with pytest.raises(BoundedReadError, match=r"is 101 bytes, over the limit of 100"):
        p.write_bytes(b"x" * 101)
        boundedread.read_bytes(p, 100)


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    # A plain open() of a FIFO without a writer blocks forever; O_NONBLOCK and fstat refuse it at once.
    with pytest.raises(BoundedReadError) as err:
        boundedread.read_bytes(fifo, 10)
    assert str(err.value) == f"{fifo}: is a FIFO, not a regular file; refused"


@pytest.mark.parametrize(("path", "kind"), [("/dev/zero", "a character device"), ("/", "a directory")])
def test_devices_and_directories_are_refused(path: str, kind: str) -> None:
    with pytest.raises(BoundedReadError, match=f"is {kind}, not a regular file"):
        boundedread.read_bytes(path, 10)


def test_a_missing_file_stays_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        boundedread.read_bytes(tmp_path / "nope", 10)


def test_text_that_is_not_utf8_is_refused_with_its_offset(tmp_path: Path) -> None:
    p = tmp_path / "f"
    p.write_bytes(b"ok\xff")
    with pytest.raises(BoundedReadError, match=r"not UTF-8 text \(byte 2"):
        boundedread.read_text(p, 10)


def test_a_config_that_is_a_device_is_one_problem_not_an_empty_config() -> None:
    # Before: /dev/null read as an empty document, a valid config; /dev/zero was read to 3.7 GB.
    cfg, problems = examine_config("/dev/null")
    assert cfg is None
    assert [str(p) for p in problems] == [
        "/dev/null: cannot read the config: is a character device, not a regular file; refused"]


def test_check_config_of_a_fifo_answers_at_once(tmp_path: Path) -> None:
    # Before: --check-config FIFO hung until a writer came.
    fifo = tmp_path / "c.yaml"
    os.mkfifo(fifo)
    cfg, problems = examine_config(fifo)
    assert cfg is None and [p.reason for p in problems] == [
        "cannot read the config: is a FIFO, not a regular file; refused"]


def test_a_config_over_the_cap_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(boundedread, "CONFIG_MAX_BYTES", 64)
    p = tmp_path / "big.yaml"
    p.write_text("# " + "x" * 100 + "\n")
    cfg, problems = examine_config(p)
    assert cfg is None and "over the limit of 64" in problems[0].reason


def test_a_fail2ban_include_of_a_device_or_fifo_is_refused_with_its_name(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for target in ("/dev/null", str(fifo)):
        conf = tmp_path / "f.conf"
        conf.write_text(f"[INCLUDES]\nbefore = {target}\n[Definition]\nfailregex = ^x <HOST>$\n")
        with pytest.raises(FilterError) as err:
            read_filter(conf)
        assert str(err.value).startswith(f"{target}: is a ")


def test_a_yaml_filter_that_is_a_fifo_is_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "filt.yaml"
    os.mkfifo(fifo)
    with pytest.raises(FilterError, match="is a FIFO, not a regular file"):
        load_filter(str(fifo))


def test_ban_from_stdin_is_bounded_per_line_and_in_targets() -> None:
    # `ban - < /dev/zero` read forever (no newline ever came); a list over what one request carries was read
    # whole, then refused by the daemon.
    from nftblockd.cli.targets import MAX_STDIN_LINE, MAX_STDIN_TARGETS, UsageError, targets_from_stream

    with open("/dev/zero") as zero, pytest.raises(UsageError, match=f"stdin line 1: longer than {MAX_STDIN_LINE}"):
        targets_from_stream(zero)
    with pytest.raises(UsageError, match=f"more than {MAX_STDIN_TARGETS} targets"):
        targets_from_stream(io.StringIO("203.0.113.7\n" * (MAX_STDIN_TARGETS + 1)))
    assert len(targets_from_stream(io.StringIO("203.0.113.7\n" * 3))) == 3


def test_import_fail2ban_config_refuses_an_include_of_a_fifo_or_device_in_one_line(tmp_path: Path) -> None:
    # Before: /dev/zero was read to 3.7 GB, then a traceback; a FIFO hung the command.
    from nftblockd.cli.main import main

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for target in (str(fifo), "/dev/zero"):
        (tmp_path / "jail.conf").write_text(f"[INCLUDES]\nbefore = {target}\n[sshd]\nenabled = true\n")
        out, err = io.StringIO(), io.StringIO()
        code = main(["import-fail2ban-config", str(tmp_path)], stdin=io.StringIO(), stdout=out, stderr=err,
                    environ={})
        assert code == 1 and out.getvalue() == ""
        assert err.getvalue().endswith(f"{target}: is a {'FIFO' if target == str(fifo) else 'character device'}, "
                                       "not a regular file; refused\n")
        assert err.getvalue().count("\n") == 1


async def test_a_feed_file_source_that_is_a_fifo_is_a_failed_fetch_not_a_hang(tmp_path: Path) -> None:
    from nftblockd.feeds.fetch import FeedError
    from tests.unit.test_feed_fetch import fetcher, make_cfg

    fifo = tmp_path / "drop.txt"
    os.mkfifo(fifo)
    with pytest.raises(FeedError, match=r"cannot read .*drop\.txt: is a FIFO, not a regular file; refused"):
        await fetcher(make_cfg(path=str(fifo)), tmp_path / "cache").fetch()
