"""`flowforge apply DIR` (flowforge/cli/apply.py) against a real bin/api: the diff, one
publish per new or changed workflow, drift as an exit status, absent workflows reported,
a second run that changes nothing, and a folder with one bad file refused whole."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import psycopg

from flowforge.store import apikeys
from tests.integration.test_cli_remote import remote
from tests.support.api import Api

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "docs" / "examples"


def _folder(tmp_path: Path, *names: str) -> Path:
    folder = tmp_path / "workflows"
    folder.mkdir(exist_ok=True)
    for name in names:
        shutil.copy(EXAMPLES / f"{name}.json", folder / f"{name}.json")
    return folder


def _versions(db: psycopg.Connection) -> dict[str, int]:
    return dict(db.execute("SELECT key, latest_version FROM workflows").fetchall())


def test_apply_publishes_what_changed_once_and_reports_drift(
    tmp_path: Path, api: str, api_key: str, client: Api, db: psycopg.Connection
) -> None:
    client.publish("legacy", json.loads((EXAMPLES / "orders.json").read_text()))
    client.publish("charge", json.loads((EXAMPLES / "charge.json").read_text()))
    folder = _folder(tmp_path, "charge", "order-sync", "orders")
    changed = json.loads((folder / "charge.json").read_text())
    changed["steps"][0]["request"]["timeout_s"] = 3
    (folder / "charge.json").write_text(json.dumps(changed))

    dry = remote(api, api_key, "apply", str(folder), "--dry-run")
    assert dry.returncode == 3, dry
    assert "+ order-sync: new workflow" in dry.stdout
    assert "~ charge: changed since version 1" in dry.stdout
    assert "    ~ $.steps[id=charge].request.timeout_s: 2 → 3" in dry.stdout
    assert "? legacy: published, but absent from the folder" in dry.stdout
    assert dry.stdout.strip().endswith("dry run: nothing published")
    assert _versions(db) == {"legacy": 1, "charge": 1}

    done = remote(api, api_key, "apply", str(folder))
    assert done.returncode == 0, done
    assert _versions(db) == {"legacy": 1, "charge": 2, "order-sync": 1, "orders": 1}

    again = remote(api, api_key, "--output", "json", "apply", str(folder), "--dry-run")
    assert again.returncode == 0, again
    summary = json.loads(again.stdout)
    assert summary["new"] == [] and summary["changed"] == {} and summary["published"] == {}
    assert sorted(summary["unchanged"]) == ["charge", "order-sync", "orders"]
    assert summary["absent"] == ["legacy"]
    second = remote(api, api_key, "apply", str(folder))
    assert second.returncode == 0 and "nothing to do" in second.stdout
    assert _versions(db) == {"legacy": 1, "charge": 2, "order-sync": 1, "orders": 1}


def test_one_invalid_file_refuses_the_whole_folder(
    tmp_path: Path, api: str, api_key: str, db: psycopg.Connection
) -> None:
    folder = _folder(tmp_path, "charge", "orders")
    broken = json.loads((EXAMPLES / "order-sync.json").read_text())
    broken["steps"][1]["depends_on"] = ["nowhere"]
    (folder / "zz-broken.json").write_text(json.dumps(broken))
    (folder / "notes.json").write_text("{not json")

    refused = remote(api, api_key, "apply", str(folder))
    assert refused.returncode == 2, refused
    assert "zz-broken.json: $.steps[1].depends_on" in refused.stderr
    assert "notes.json: not a JSON file" in refused.stderr
    assert _versions(db) == {}


def test_a_file_the_server_would_refuse_refuses_the_whole_folder(
    tmp_path: Path, api: str, db: psycopg.Connection
) -> None:
    """Valid here, refused by the dry-run publish (this key may not publish secrets): the
    folder's other, acceptable files are not published either."""
    key = apikeys.create(db, "no secrets")[1]
    folder = _folder(tmp_path, "charge", "orders")
    secretive = json.loads((EXAMPLES / "charge.json").read_text())
    secretive["steps"][0]["request"]["headers"] = {"Authorization": "Bearer {{ secrets.pay }}"}
    (folder / "pay.json").write_text(json.dumps(secretive))

    refused = remote(api, key, "apply", str(folder))
    assert refused.returncode == 2, refused
    assert "pay.json: " in refused.stderr and "secret" in refused.stderr
    assert _versions(db) == {}
