"""kvbmgo._control, the guard both engines' P/D side channels share, without
an engine: the engines' own tests (tests/vllm_connector/test_disagg_trust.py,
tests/sglang/test_pd.py) attack it through their channels."""

import os
import stat
import time

import pytest

from kvbmgo import _control

KEY = b"kvbm-test-deployment-key-0123456789abcdef"


def test_tokens_are_fresh_and_compared_strictly():
    a, b = _control.new_token(), _control.new_token()
    assert a != b and len(a) == 2 * _control.TOKEN_BYTES
    assert _control.same_token(a, a)
    assert not _control.same_token(b, a)
    assert not _control.same_token("", "")  # an empty token proves nothing
    assert not _control.same_token(None, a) and not _control.same_token(7, a)
    assert not _control.same_token("\udc80", a)  # never raises


def test_allow_list_dials_what_it_checked():
    allow = _control.AllowList(["10.0.0.0/8", "Prefill-0", "::1"])
    assert allow.address("prefill-0", 5710) == "prefill-0"  # named: as given
    assert allow.address("10.1.2.3", 5710) == "10.1.2.3"
    assert allow.address("::1", 5710) == "::1"
    assert allow.address("192.168.0.1", 5710) is None
    # A name is resolved, and the allowed address it resolves to dialled.
    assert _control.AllowList(["10.0.0.0/8"]).address("localhost", 5710) is None
    assert _control.AllowList(["127.0.0.0/8"]).address("localhost", 5710) == "127.0.0.1"
    for ok in ("10.0.0.0/8", "::1", "prefill-0.example"):
        assert _control.allow_entry(ok)
    for bad in ("-x", "a b", "x" * 300):
        assert not _control.allow_entry(bad)


def test_auth_binds_key_domain_receiver_and_time():
    a = _control.Auth(KEY, "sender", "prefill", domain=b"one\0")
    b = _control.Auth(KEY, "me", "decode", domain=b"one\0", me="10.0.0.1:7000")
    other = _control.Auth(KEY, "me", "decode", domain=b"two\0", me="10.0.0.1:7000")
    msg = a.sign([b"TAG", b"1"], "10.0.0.1:7000")
    assert b.open(list(msg)) == ([b"TAG", b"1"], "sender")
    assert b.open(list(msg)) is None and b.refused == {"replay": 1}
    assert other.open(list(msg)) is None and other.refused == {"bad mac": 1}
    # Signed for another instance (same key, same domain): never verifies here.
    elsewhere = _control.Auth(KEY, "me", "decode", domain=b"one\0", me="10.0.0.2:7000")
    assert elsewhere.open(list(a.sign([b"TAG"], "10.0.0.1:7000"))) is None
    assert elsewhere.refused == {"wrong receiver": 1}
    assert b.open(a.sign([b"TAG"], "x"), me="x") == ([b"TAG"], "sender")  # per-message receiver
    old = time.time_ns() - int(2 * _control.WINDOW_S * 1e9)
    stamp = f"sender\n10.0.0.1:7000\n{old}\n00".encode()
    stale = [b"TAG", _control.AUTH_TAG, stamp, _control.mac(KEY, b"one\0", [b"TAG"], stamp)]
    assert b.open(stale) is None and b.refused["stale"] == 1
    assert b.open([b"TAG", b"1"]) is None and b.refused["unauthenticated"] == 1
    assert _control.Auth(None, "x", "decode", domain=b"one\0").open(msg) is None
    assert _control.Auth(None, "x", "decode", domain=b"one\0").sign([b"T"], "y") == [b"T"]
    with pytest.raises(ValueError, match="line break"):
        a.sign([b"TAG"], "a\nb")
    assert b.from_sender([b"TAG"], None, "anyone", "decode")  # no key: nothing to check
    assert b.from_sender([b"TAG"], "sender", "sender", "decode")
    assert not b.from_sender([b"TAG"], "sender", "someone", "decode")
    assert b.refused["not its sender"] == 1


def test_load_key(monkeypatch, tmp_path):
    monkeypatch.delenv(_control.ENV_KEY, raising=False)
    monkeypatch.delenv(_control.ENV_KEY_FILE, raising=False)
    assert _control.load_key() is None
    f = tmp_path / "key"
    f.write_bytes(KEY + b"\n")
    f.chmod(0o600)
    monkeypatch.setenv(_control.ENV_KEY_FILE, str(f))
    assert _control.load_key() == KEY
    monkeypatch.setenv(_control.ENV_KEY, KEY.decode())
    with pytest.raises(ValueError, match="^x: .*not both"):
        _control.load_key("x")
    monkeypatch.delenv(_control.ENV_KEY_FILE)
    monkeypatch.setenv(_control.ENV_KEY, "short")
    with pytest.raises(ValueError, match="at least 16"):
        _control.load_key()


# ---- which key: explicit, same-host, opted out, or refused

@pytest.fixture
def no_key(monkeypatch, tmp_path):
    """No key, no opt-out, the same-host key's directory under tmp_path."""
    for v in (_control.ENV_KEY, _control.ENV_KEY_FILE, _control.ENV_UNAUTHENTICATED):
        monkeypatch.delenv(v, raising=False)
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(run))
    return run


def test_loopback():
    for h in ("127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost", "127.0.0.0/8",
              "::ffff:127.0.0.1"):
        assert _control.is_loopback(h), h
    for h in ("0.0.0.0", "::", "10.1.2.3", "10.0.0.0/8", "0.0.0.0/0", "", "no-such-host.invalid"):
        assert not _control.is_loopback(h), h
    assert _control.endpoint("[::1]", 5) == _control.endpoint("0:0::1", 5) == "::1:5"
    assert _control.endpoint("Prefill-0", 5) == "prefill-0:5"


def test_an_explicit_key_wins(no_key, monkeypatch):
    monkeypatch.setenv(_control.ENV_KEY, KEY.decode())
    monkeypatch.setenv(_control.ENV_UNAUTHENTICATED, "1")  # the key wins over the opt-out
    c = _control.choose_key("x", ["10.1.2.3"])
    assert c == (KEY, _control.EXPLICIT, _control.ENV_KEY)
    assert c.may_dial("10.9.9.9") is None
    assert not os.listdir(no_key)  # no same-host key made


def test_no_key_on_loopback_is_a_same_host_key_only_this_user_reads(no_key):
    c = _control.choose_key("x", ["127.0.0.1", "localhost"])
    assert c.how == _control.SAME_HOST and len(c.key) == 64
    d = no_key / "kvbm"
    assert c.where == str(d / "pd.key")
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(d / "pd.key").st_mode) == 0o600
    assert os.listdir(d) == ["pd.key"]
    assert _control.choose_key("y", ["::1"]).key == c.key  # made once, then read
    assert c.may_dial("127.0.0.1") is None
    why = c.may_dial("10.1.2.3")
    assert _control.ENV_KEY in why and _control.ENV_KEY_FILE in why


def test_no_key_across_hosts_refuses_naming_the_variables(no_key):
    for hosts in (["0.0.0.0"], ["127.0.0.1", "10.1.2.3"], ["10.0.0.0/8"]):
        with pytest.raises(ValueError) as e:
            _control.choose_key("kvbm x", hosts)
        msg = str(e.value)
        assert msg.startswith("kvbm x: ") and hosts[-1] in msg
        for v in (_control.ENV_KEY, _control.ENV_KEY_FILE, _control.ENV_UNAUTHENTICATED):
            assert v in msg
    assert not os.listdir(no_key)


def test_the_opt_out_is_unauthenticated_and_warns_at_every_start(no_key, monkeypatch, caplog):
    import logging
    monkeypatch.setenv(_control.ENV_UNAUTHENTICATED, "1")
    with caplog.at_level(logging.WARNING, logger="kvbmgo._control"):
        for _ in range(2):
            c = _control.choose_key("x", ["0.0.0.0"])
            assert c.key is None and c.how == _control.UNAUTHENTICATED
            assert c.may_dial("10.1.2.3") is None
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and all("unauthenticated" in m and _control.ENV_KEY in m
                                   for m in lines), lines
    monkeypatch.setenv(_control.ENV_UNAUTHENTICATED, "maybe")
    with pytest.raises(ValueError, match=_control.ENV_UNAUTHENTICATED):
        _control.choose_key("x", ["127.0.0.1"])


def test_the_same_host_key_refuses_what_others_can_read_or_write(no_key):
    d = no_key / "kvbm"
    key, path = _control.same_host_key("x")
    os.chmod(path, 0o644)
    with pytest.raises(ValueError, match="other users"):
        _control.same_host_key("x")
    os.chmod(path, 0o600)
    os.chmod(d, 0o755)
    with pytest.raises(ValueError, match="other users"):
        _control.same_host_key("x")
    os.chmod(d, 0o700)
    assert _control.same_host_key("x") == (key, path)
    if os.geteuid() == 0:  # another user's file
        os.chown(path, 12345, -1)
        with pytest.raises(ValueError, match="uid 12345"):
            _control.same_host_key("x")
        os.chown(path, 0, -1)
    with open(path, "w") as f:
        f.write("short\n")
    with pytest.raises(ValueError, match="remove it"):
        _control.same_host_key("x")
    os.unlink(path)
    os.symlink("/etc/hostname", path)
    with pytest.raises(ValueError):
        _control.same_host_key("x")


def _first_start(barrier, out):
    barrier.wait()
    out.put(_control.same_host_key("x")[0])


def test_concurrent_first_starts_end_with_one_key(no_key):
    import multiprocessing
    ctx = multiprocessing.get_context("fork")
    n = 8
    barrier, out = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_first_start, args=(barrier, out)) for _ in range(n)]
    for p in procs:
        p.start()
    keys = [out.get(timeout=30) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    assert len(set(keys)) == 1
    assert os.listdir(no_key / "kvbm") == ["pd.key"]  # no half-made file left
    assert _control.same_host_key("x")[0] == keys[0]


def test_the_key_directory_is_xdg_runtime_dir_or_the_users_cache(monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/1000")
    assert _control.key_dir() == "/run/user/1000/kvbm"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    monkeypatch.setenv("HOME", "/home/u")
    assert _control.key_dir() == "/home/u/.cache/kvbm/pd-auth"
