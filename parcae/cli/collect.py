"""``parcae collect``: record the job's spot fleet, spot prices and placement scores from EC2 into the trace store.

Owns: the command's options and its report. Must not touch: the EC2 calls and the store (`forecasting.SpotCollector`,
`forecasting.TraceStore`).
"""

import math
from datetime import timedelta
from typing import Annotated, Any

import typer
from rich import box
from rich.table import Table

from parcae.cli.common import EXIT_FAILED, UserError, command, error, stdout, warn


def _credentials_missing(session: Any) -> bool:
    try:
        return session.get_credentials() is None
    except Exception:  # a broken profile: the collector reports it precisely once a region is set
        return True


@command(
    help=(
        "Collect the job's spot fleet (instances tagged parcae:job=TAG), spot prices and placement scores "
        "from EC2 into the local trace store. Credentials come from the standard AWS chain (AWS_PROFILE, "
        "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, SSO, instance profile). Exit code 1 if a call failed."
    )
)
def collect(
    store: Annotated[
        str | None,
        typer.Option(
            metavar="DIR|s3://BUCKET/PREFIX",
            help="Trace store: a folder or an S3 prefix (default: $PARCAE_TRACE_STORE or ./trace-store).",
        ),
    ] = None,
    region: Annotated[
        list[str] | None,
        typer.Option("--region", metavar="R", help="Region to collect; repeat (default: the profile's)."),
    ] = None,
    instance_type: Annotated[
        list[str] | None,
        typer.Option(
            "--instance-type", metavar="T", help="Instance type for prices and scores; repeat (default p3.2xlarge)."
        ),
    ] = None,
    job_tag: Annotated[
        str, typer.Option(metavar="TAG", help="Value of the parcae:job tag of the job's instances.")
    ] = "parcae-job",
    endpoint_url: Annotated[
        str | None, typer.Option(metavar="URL", help="Send EC2 calls here (a VPC endpoint, or a local moto_server).")
    ] = None,
    price_hours: Annotated[float, typer.Option(help="Collect spot prices of the last this many hours.")] = 1.0,
    target_capacity: Annotated[int, typer.Option(min=1, help="Instances asked for in the placement scores.")] = 32,
) -> None:
    from forecasting import CollectError, SpotCollector, TraceStore

    if not (math.isfinite(price_hours) and price_hours > 0):
        raise UserError(f"--price-hours must be a positive number of hours, got {price_hours:g}")
    try:
        collector = SpotCollector(
            regions=region or None,
            instance_types=tuple(instance_type or ("p3.2xlarge",)),
            job_tag=job_tag,
            store=TraceStore(store) if store is not None else None,
            endpoint_url=endpoint_url,
        )
        try:
            regions = collector.regions
        except CollectError as exc:
            if _credentials_missing(collector.session):
                raise CollectError(
                    f"{exc}. Also, no AWS credentials were found: set AWS_PROFILE to a configured profile, or "
                    "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
                ) from None
            raise
        done = collector.collect_round(timedelta(hours=price_hours), target_capacity)
    except CollectError as exc:
        raise UserError(str(exc)) from None
    except ValueError as exc:  # e.g. a malformed --endpoint-url
        raise UserError(str(exc)) from None
    except OSError as exc:  # the store's folder: its path is in the message
        raise UserError(f"the trace store cannot be used: {exc}") from None

    out = stdout()
    out.print(f"store {collector.store.uri}, job tag {job_tag!r}, regions {', '.join(regions)}", soft_wrap=True)
    table = Table(box=box.SIMPLE_HEAD, show_edge=False)
    table.add_column("table", no_wrap=True)
    table.add_column("rows written", justify="right")
    table.add_column("errors", justify="right")
    table.add_column("unsupported", justify="right")
    for name, r in done.results.items():
        table.add_row(name, str(sum(r.rows_written.values())), str(len(r.errors)), str(len(r.unsupported)))
    out.print(table)
    compacted = sum(done.compacted.values())
    if compacted:
        out.print(f"compacted: {compacted} part files merged")
    for line in done.unsupported:
        warn(f"unsupported: {line}")
    for line in done.errors:
        error(line)
    if done.errors:
        raise typer.Exit(EXIT_FAILED)
