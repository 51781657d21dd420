"""The auth/tls config sections and the configured authenticator (without a database)."""
import asyncio
import time

import pytest

from fluxpg.auth import AuthError, OpenAuthenticator, authenticator_for, hash_password, verify_password
from fluxpg.auth_config import ConfiguredAuthenticator
from fluxpg.config import AuthConfig, Config, ConfigError, load_config


def test_plain_password_is_hashed_on_load():
    cfg = AuthConfig(users=[{"username": "dev", "password": "letmein"}])
    user = cfg.users[0]
    assert user.password is None
    assert verify_password("letmein", user.password_hash)
    assert "letmein" not in repr(cfg) and "letmein" not in str(cfg.model_dump())


@pytest.mark.parametrize("user, message", [
    ({"username": "x"}, "exactly one"),
    ({"username": "x", "password": "a", "password_hash": "scrypt$16384$8$1$AAAAAAAAAAAAAAAAAAAAAA$" + "B" * 43},
     "exactly one"),
    ({"username": "x", "password_hash": "md5$abc"}, "scrypt"),
    ({"username": "x", "password": "a", "permissions": [{"action": "steal", "pattern": "q"}]}, "action"),
    ({"username": "x", "password": "a", "permissions": [{"action": "publish", "pattern": "$queue/a/#/b"}]}, "#"),
    ({"username": "", "password": "a"}, "username"),
])
def test_bad_users_are_refused(user, message):
    with pytest.raises(ValueError, match=message):
        AuthConfig(users=[user])


def test_duplicate_users_and_unknown_keys(tmp_path):
    with pytest.raises(ValueError, match="duplicate user"):
        AuthConfig(users=[{"username": "a", "password": "1"}, {"username": "a", "password": "2"}])
    path = tmp_path / "fluxpg.yaml"
    path.write_text("auth:\n  allow_anonymus: true\n")
    with pytest.raises(ConfigError, match="allow_anonymous"):
        load_config(path)


def test_yaml_with_auth_and_tls(tmp_path):
    path = tmp_path / "fluxpg.yaml"
    path.write_text(
        "auth:\n"
        "  users:\n"
        f"    - username: alice\n      password_hash: \"{hash_password('pw', n=1024)}\"\n"
        "      permissions: [{action: consume, pattern: orders}]\n"
        "tls:\n  cert_file: /c.pem\n  key_file: /k.pem\n  listeners: [amqp]\n")
    config = load_config(path)
    assert config.auth.users[0].permissions[0].pattern == "orders"
    assert config.tls.applies_to("amqp") and not config.tls.applies_to("mqtt")


def test_the_documented_example_config_loads():
    config = load_config("config/fluxpg.yaml")
    assert config.auth is None and config.tls is None
    assert isinstance(authenticator_for(config), OpenAuthenticator)


async def test_configured_authenticator_without_database():
    auth = authenticator_for(Config(auth={"users": [
        {"username": "alice", "password": "pw", "permissions": [{"action": "publish", "pattern": "orders"}]}]}))
    assert isinstance(auth, ConfiguredAuthenticator) and auth.enabled and not auth.allow_anonymous
    p = await auth.authenticate("alice", "pw", protocol="mqtt", peer="10.0.0.1:1")
    assert p.username == "alice" and p.allowed("publish", "$queue/orders/x") and not p.allowed("consume", "orders")
    p = await auth.authenticate("alice", b"pw", protocol="mqtt", peer="10.0.0.1:1")   # cached check
    assert p.username == "alice"
    with pytest.raises(AuthError):
        await auth.authenticate("alice", "wrong", protocol="mqtt", peer="10.0.0.2:1")
    with pytest.raises(AuthError):
        await auth.authenticate(None, None, protocol="amqp10", peer="10.0.0.3:1")
    with pytest.raises(AuthError):
        await auth.authenticate("alice", None, protocol="amqp091", peer="10.0.0.4:1")


async def test_failure_delays_grow_per_peer_and_do_not_block_others():
    auth = ConfiguredAuthenticator(AuthConfig(users=[{"username": "u", "password": "p"}]))

    async def fail() -> float:
        started = time.monotonic()
        with pytest.raises(AuthError):
            await auth.authenticate("u", "bad", protocol="mqtt", peer="192.0.2.7:1000")
        return time.monotonic() - started

    delays = [await fail() for _ in range(3)]
    assert delays[0] < delays[1] < delays[2]
    # a good login from elsewhere runs while a slowed failure sleeps
    slow = asyncio.ensure_future(fail())
    started = time.monotonic()
    assert (await auth.authenticate("u", "p", protocol="mqtt", peer="198.51.100.1:1")).username == "u"
    assert time.monotonic() - started < 0.5
    assert await slow <= 1.5 + 0.5


async def test_anonymous_when_allowed():
    auth = ConfiguredAuthenticator(AuthConfig(allow_anonymous=True,
                                              anonymous_permissions=[{"action": "consume", "pattern": "public"}]))
    p = await auth.authenticate(None, None, protocol="amqp10")
    assert p.anonymous and p.allowed("consume", "public") and not p.allowed("publish", "$queue/public/x")
