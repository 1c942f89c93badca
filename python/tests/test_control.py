"""kvbmgo._control, the guard both engines' P/D side channels share, without
an engine: the engines' own tests (tests/vllm_connector/test_disagg_trust.py,
tests/sglang/test_pd.py) attack it through their channels."""

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


def test_auth_binds_key_domain_and_time():
    a = _control.Auth(KEY, "sender", "prefill", domain=b"one\0")
    b = _control.Auth(KEY, "me", "decode", domain=b"one\0")
    other = _control.Auth(KEY, "me", "decode", domain=b"two\0")
    msg = a.sign([b"TAG", b"1"])
    assert b.open(list(msg)) == ([b"TAG", b"1"], "sender")
    assert b.open(list(msg)) is None and b.refused == {"replay": 1}
    assert other.open(list(msg)) is None and other.refused == {"bad mac": 1}
    old = time.time_ns() - int(2 * _control.WINDOW_S * 1e9)
    stamp = f"sender:{old}:00".encode()
    stale = [b"TAG", _control.AUTH_TAG, stamp, _control.mac(KEY, b"one\0", [b"TAG"], stamp)]
    assert b.open(stale) is None and b.refused["stale"] == 1
    assert b.open([b"TAG", b"1"]) is None and b.refused["unauthenticated"] == 1
    assert _control.Auth(None, "x", "decode", domain=b"one\0").open(msg) is None
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
