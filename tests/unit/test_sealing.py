"""The sealing format and how the key is read: AES-256-GCM bound to its row."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from flowforge.store.config import ConfigError, Settings
from flowforge.trust import sealing

KEY = sealing.parse_key(sealing.new_key())


def test_a_sealed_secret_opens_only_for_its_own_row_and_key() -> None:
    sealed = sealing.seal(KEY, "whsec_abc", workflow_id=3, secret_id=7)
    assert b"whsec_abc" not in sealed
    assert sealing.unseal(KEY, sealed, 3, 7) == "whsec_abc"
    # Same secret sealed twice differs (random nonce): equal secrets are not recognisable.
    assert sealing.seal(KEY, "whsec_abc", 3, 7) != sealed
    for workflow_id, secret_id in [(3, 8), (4, 7)]:
        with pytest.raises(sealing.SecretUnreadable):
            sealing.unseal(KEY, sealed, workflow_id, secret_id)
    with pytest.raises(sealing.SecretUnreadable):
        sealing.unseal(sealing.parse_key(sealing.new_key()), sealed, 3, 7)
    tampered = sealed[:-1] + bytes([sealed[-1] ^ 1])
    with pytest.raises(sealing.SecretUnreadable):
        sealing.unseal(KEY, tampered, 3, 7)
    with pytest.raises(sealing.EncryptionKeyMissing):
        sealing.unseal(None, sealed, 3, 7)


def test_python_m_flowforge_sealing_prints_a_usable_key() -> None:
    printed = subprocess.run(
        [sys.executable, "-m", "flowforge.trust.sealing"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert len(sealing.parse_key(printed)) == 32
    assert Settings.from_env({"FLOWFORGE_ENCRYPTION_KEY": printed}).encryption_key is not None


@pytest.mark.parametrize("bad", ["short", "!" * 43, "A" * 60])
def test_a_malformed_key_stops_start_up_without_printing_it(bad: str) -> None:
    with pytest.raises(ConfigError) as raised:
        Settings.from_env({"FLOWFORGE_ENCRYPTION_KEY": bad})
    assert bad not in str(raised.value)
    assert "python -m flowforge.trust.sealing" in str(raised.value)


def test_the_key_comes_from_the_environment_or_the_systemd_credential(tmp_path: Path) -> None:
    assert Settings.from_env({}).encryption_key is None
    key = sealing.new_key()
    (tmp_path / "encryption_key").write_text(key + "\n")
    from_file = Settings.from_env({"CREDENTIALS_DIRECTORY": str(tmp_path)})
    assert from_file.encryption_key == sealing.parse_key(key)
    other = sealing.new_key()
    both = Settings.from_env(
        {"CREDENTIALS_DIRECTORY": str(tmp_path), "FLOWFORGE_ENCRYPTION_KEY": other}
    )
    assert both.encryption_key == sealing.parse_key(other)
    assert key not in repr(from_file) and str(from_file.encryption_key) not in repr(from_file)
