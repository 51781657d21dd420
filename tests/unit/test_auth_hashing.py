"""Password hashes: scrypt$n$r$p$salt$hash, random salts, constant-time verification."""
import pytest

from fluxpg.auth import hash_password, parse_hash, verify_password


def test_hash_and_verify():
    encoded = hash_password("s3cret", n=2 ** 10)
    assert encoded.startswith("scrypt$1024$8$1$")
    assert verify_password("s3cret", encoded)
    assert verify_password(b"s3cret", encoded)
    assert not verify_password("s3cret ", encoded)
    assert not verify_password("", encoded)


def test_salts_differ():
    assert hash_password("same", n=2 ** 10) != hash_password("same", n=2 ** 10)


def test_unicode_passwords():
    encoded = hash_password("pässwörd-🔑", n=2 ** 10)
    assert verify_password("pässwörd-🔑", encoded)


@pytest.mark.parametrize("bad", ["", "plain", "bcrypt$1$2$3$4$5", "scrypt$abc$8$1$AAAA$BBBB",
                                 "scrypt$1000$8$1$AAAAAAAAAAA$BBBBBBBBBBBBBBBBBBBBBBB",   # n not a power of 2
                                 "scrypt$16384$8$1$!!$BBBB", "scrypt$16384$8$1$AAAA$BBBB"])  # short salt/hash
def test_malformed_hashes_are_refused(bad):
    with pytest.raises(ValueError):
        parse_hash(bad)
    assert verify_password("anything", bad) is False


def test_empty_password_cannot_be_hashed():
    with pytest.raises(ValueError):
        hash_password("")
