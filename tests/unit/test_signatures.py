"""Standard Webhooks verification against signatures made here, independently of FlowForge."""

from __future__ import annotations

import base64

import pytest

from flowforge.trust.signatures import TOLERANCE_S, SignatureInvalid, new_secret, verify
from tests.support.webhooks import sign

SECRET = "whsec_" + base64.b64encode(b"k" * 24).decode()
OTHER = "whsec_" + base64.b64encode(b"o" * 24).decode()
NOW = 1_700_000_000.0
MSG_ID = "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W"
BODY = b'{"order_id": 42, "total": 150}'


def check(
    header: str | None = None,
    *,
    secrets: tuple[str, ...] = (SECRET,),
    msg_id: str | None = MSG_ID,
    timestamp: str | None = str(int(NOW)),
    body: bytes = BODY,
) -> None:
    if header is None:
        header = sign(SECRET, MSG_ID, str(int(NOW)), BODY)
    verify(secrets, msg_id, timestamp, header, body, NOW)


def test_valid_signature_passes() -> None:
    check()


def test_tolerance_is_five_minutes() -> None:
    assert TOLERANCE_S == 300


@pytest.mark.parametrize("tampered", [BODY + b" ", BODY.replace(b" ", b""), b"", BODY.upper()])
def test_tampered_body_fails(tampered: bytes) -> None:
    with pytest.raises(SignatureInvalid, match="no matching signature"):
        check(body=tampered)


def test_tampered_id_fails() -> None:
    with pytest.raises(SignatureInvalid, match="no matching signature"):
        check(msg_id="msg_other")


def test_wrong_secret_fails() -> None:
    with pytest.raises(SignatureInvalid, match="no matching signature"):
        check(secrets=(OTHER,))


def test_no_secrets_fails() -> None:
    with pytest.raises(SignatureInvalid, match="no matching signature"):
        check(secrets=())


@pytest.mark.parametrize("offset", [-299, -300, 0, 299, 300])
def test_timestamps_within_tolerance_pass(offset: int) -> None:
    timestamp = str(int(NOW) + offset)
    check(sign(SECRET, MSG_ID, timestamp, BODY), timestamp=timestamp)


@pytest.mark.parametrize("offset", [-301, 301, -86_400])
def test_stale_and_future_timestamps_fail(offset: int) -> None:
    timestamp = str(int(NOW) + offset)
    with pytest.raises(SignatureInvalid, match="timestamp outside tolerance"):
        check(sign(SECRET, MSG_ID, timestamp, BODY), timestamp=timestamp)


@pytest.mark.parametrize(
    ("field", "reason"),
    [
        ("msg_id", "missing webhook-id header"),
        ("timestamp", "missing webhook-timestamp header"),
        ("header", "missing webhook-signature header"),
    ],
)
@pytest.mark.parametrize("value", [None, ""])
def test_missing_headers_fail(field: str, reason: str, value: str | None) -> None:
    args: dict[str, str | None] = {
        "msg_id": MSG_ID,
        "timestamp": str(int(NOW)),
        "header": sign(SECRET, MSG_ID, str(int(NOW)), BODY),
    }
    args[field] = value
    with pytest.raises(SignatureInvalid, match=reason):
        verify([SECRET], args["msg_id"], args["timestamp"], args["header"], BODY, NOW)


@pytest.mark.parametrize("timestamp", ["1700000000.5", "abc", "-1700000000", " 1700000000", "1e9"])
def test_non_integer_timestamp_fails(timestamp: str) -> None:
    with pytest.raises(SignatureInvalid, match="not an integer"):
        check(sign(SECRET, MSG_ID, timestamp, BODY), timestamp=timestamp)


def test_second_of_several_signatures_may_match() -> None:
    timestamp = str(int(NOW))
    check(f"{sign(OTHER, MSG_ID, timestamp, BODY)} {sign(SECRET, MSG_ID, timestamp, BODY)}")


@pytest.mark.parametrize("signer", [SECRET, OTHER])
def test_either_active_secret_verifies_during_rotation(signer: str) -> None:
    check(sign(signer, MSG_ID, str(int(NOW)), BODY), secrets=(SECRET, OTHER))


def test_other_versions_are_ignored() -> None:
    good = sign(SECRET, MSG_ID, str(int(NOW)), BODY)
    check(f"v2,{good[3:]} {good}")
    with pytest.raises(SignatureInvalid, match="no v1 signature"):
        check(f"v2,{good[3:]} v1a,{good[3:]}")


def test_bad_base64_fails() -> None:
    with pytest.raises(SignatureInvalid, match="bad base64"):
        check("v1,not*base64!")


def test_new_secret_format() -> None:
    secret = new_secret()
    assert secret.startswith("whsec_")
    assert len(base64.b64decode(secret.removeprefix("whsec_"), validate=True)) == 24
    assert new_secret() != secret
    check(sign(secret, MSG_ID, str(int(NOW)), BODY), secrets=(secret,))
