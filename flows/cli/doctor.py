"""``sailor doctor [--cloud aws|gcp]``: what the configured clouds lack for Sailor's jobs, and how to fix it.

Imports happen inside the command so ``sailor --help`` stays light.
"""

from __future__ import annotations

from typing import Optional

import typer

from flows.cli.common import console, fail, print_json


def doctor_cmd(
    cloud: Optional[list[str]] = typer.Option(None, "--cloud", help="aws or gcp (repeatable; default both)."),
    gpu: Optional[list[str]] = typer.Option(None, "--gpu", help="GPU types whose quotas to check (default all)."),
    as_json: bool = typer.Option(False, "--json", help="Print the checks as JSON."),
) -> None:
    """Check credentials, project/regions, the image, the jobs' bucket (private, encrypted, writable),
    IAM / service account, and spot GPU quotas; exits non-zero when something is missing."""
    # lazy: loaded when the command runs (the CLI starts light)
    from infra import doctor
    from infra.config import describe_mode, get_providers, real_clouds
    from sailor_core import settings

    providers = get_providers(cloud or None)
    embedded = not real_clouds()
    checks = []
    for provider in providers.values():
        checks += doctor.check_cloud(provider, gpus=gpu or (), embedded=embedded)
    if embedded:
        # lazy: loaded when the command runs (the CLI starts light)
        from infra.buckets import ensure_private_bucket
        from infra.config import embedded_endpoints, point_at_embedded_storage
        from tasks.embedded_bucket import EMBEDDED_BUCKET, embedded_s3_client

        ends = embedded_endpoints()
        point_at_embedded_storage(ends["aws_endpoint"], ends.get("gcs_endpoint"), tuple(ends["aws_keys"]))
        client = embedded_s3_client(ends)
        jobs_url = f"s3://{EMBEDDED_BUCKET}/doctor"
        ensure_private_bucket(jobs_url, client=client)
        checks += doctor.check_bucket(jobs_url, s3_client=client)
    else:
        checks += doctor.check_bucket(settings.jobs_url())
    missing = [c for c in checks if c.status == doctor.MISSING]
    if as_json:
        print_json({"source": describe_mode(), "ok": not missing, "checks": [c.to_dict() for c in checks]})
    else:
        # lazy: loaded when the command runs (the CLI starts light)
        from rich.table import Table

        table = Table(title=f"sailor doctor ({describe_mode()})")
        for col in ("cloud", "check", "status", "detail", "how to fix"):
            table.add_column(col)
        style = {doctor.OK: "green", doctor.MISSING: "red", doctor.WARN: "yellow"}
        for c in checks:
            table.add_row(c.cloud, c.name, f"[{style[c.status]}]{c.status}[/]", c.detail, c.fix)
        console().print(table)
    if missing:
        raise fail(f"{len(missing)} missing: " + "; ".join(f"{c.cloud} {c.name}" for c in missing))


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor_cmd)
