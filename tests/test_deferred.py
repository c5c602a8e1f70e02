"""Imports that Inlet never uses are deferred: a process does not pay for them, and they load if anything uses them."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_lancedb_works_without_the_namespace_rest_client_which_still_loads_when_used(tmp_path):
    # In a fresh interpreter: the test session has imported everything already.
    probe = textwrap.dedent("""
        import sys
        import pyarrow as pa
        import tasks.store
        import lancedb

        print("api" if "lance_namespace_urllib3_client.api.table_api" in sys.modules else "no api")
        db = lancedb.connect(sys.argv[1])
        db.create_table("t", pa.table({"a": [1, 2, 3]}))
        print(db.open_table("t").search().where("a > 1").to_arrow().num_rows)
        import lance_namespace_urllib3_client as client

        print(client.ApiClient.__name__, client.models.JsonArrowSchema.__name__, type(client).__name__)
    """)
    out = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "db")], cwd=ROOT, capture_output=True,
                         text=True, check=False, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split("\n")[:3] == ["no api", "2", "ApiClient JsonArrowSchema Deferred"]
