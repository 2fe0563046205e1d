"""Tests for forecasting.collect: fleet/price/score collection into the trace store, errors, a moto_server run.

Everything is offline. AWS is moto (in-process ``mock_aws``, or ``ThreadedMotoServer`` on 127.0.0.1), a
``botocore.stub.Stubber`` where moto cannot say what we need (interruption notices, placement scores,
throttling), or a ``before-send`` hook that answers at the HTTP layer so that botocore's real retry loop
runs. Clients that are not mocked point at ``http://127.0.0.1:9`` so that a mistake can never reach AWS.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import boto3
import botocore.endpoint
import pandas as pd
import pytest
from _aws import fake_aws_account, isolate_aws
from botocore.awsrequest import AWSResponse
from botocore.stub import Stubber
from moto import mock_aws

from forecasting.collect import CollectError, InstanceObservation, SpotCollector, fleet_transitions
from forecasting.trace_store import COMPACT_AT, TraceStore
from forecasting.traces import load_trace, read_event_csv, to_intervals

REGION = "us-east-1"
NOWHERE = "http://127.0.0.1:9"  # discard port: stubbed clients must never send, and never off this host
AMI = "ami-12c6146b"  # any id: moto does not validate AMIs unless told to
T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture(autouse=True)
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Fake credentials, one region, no config files, no instance metadata, no proxies."""
    isolate_aws(monkeypatch, tmp_path)
    fake_aws_account(monkeypatch, REGION)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


def stubbed(tmp_path: Path, **kw) -> tuple[SpotCollector, Stubber]:
    """A collector whose only client is stubbed (and, if the stub runs dry, aims at a closed local port)."""
    kw.setdefault("regions", [REGION])
    kw.setdefault("job_tag", "job-x")
    col = SpotCollector(store=TraceStore(tmp_path / "store"), endpoint_url=NOWHERE, **kw)
    stub = Stubber(col.client(kw["regions"][0]))
    stub.activate()
    return col, stub


def launch(ec2, n: int, tags: dict[str, str] | None, itype: str = "m5.large") -> list[str]:
    params = {
        "ImageId": AMI,
        "MinCount": n,
        "MaxCount": n,
        "InstanceType": itype,
        "InstanceMarketOptions": {"MarketType": "spot", "SpotOptions": {"SpotInstanceType": "one-time"}},
    }
    if tags:
        tag_list = [{"Key": k, "Value": v} for k, v in tags.items()]
        params["TagSpecifications"] = [{"ResourceType": "instance", "Tags": tag_list}]
    return [i["InstanceId"] for i in ec2.run_instances(**params)["Instances"]]


def no_duplicate_keys(df: pd.DataFrame, key: list[str]) -> bool:
    return not df.duplicated(subset=key).any()


# -------------------------------------------------------------------------------- fleet (moto)


def test_fleet_round_trip_with_moto(tmp_path: Path) -> None:
    store = TraceStore(tmp_path / "store")
    with mock_aws():
        ec2 = boto3.client("ec2", region_name=REGION)
        mine = launch(ec2, 3, {"parcae:job": "job-a"})
        launch(ec2, 1, {"parcae:job": "someone-else"})
        launch(ec2, 1, None)
        col = SpotCollector(regions=[REGION], instance_types=["m5.large"], job_tag="job-a", store=store)

        first = col.collect_fleet()
        assert first.ok and first.rows_written == {"fleet_events": 3}
        assert col.collect_fleet().rows_written == {"fleet_events": 0}  # nothing changed

        ec2.terminate_instances(InstanceIds=mine[:1])
        ec2.stop_instances(InstanceIds=mine[1:2])
        # the request_spot_instances path: tag the instance it launched
        req = ec2.request_spot_instances(
            InstanceCount=1, LaunchSpecification={"ImageId": AMI, "InstanceType": "m5.large"}
        )["SpotInstanceRequests"][0]
        via_request = req["InstanceId"]
        ec2.create_tags(Resources=[via_request], Tags=[{"Key": "parcae:job", "Value": "job-a"}])

        second = col.collect_fleet()
        assert second.ok and second.rows_written == {"fleet_events": 3}  # 2 removes + 1 add
        assert col.collect_fleet().rows_written == {"fleet_events": 0}

    events = store.read("fleet_events")
    assert no_duplicate_keys(events, ["instance_id", "event", "timestamp"])
    assert set(events["instance_id"]) == {*mine, via_request}
    assert sorted(events.loc[events["event"] == "add", "instance_id"]) == sorted([*mine, via_request])
    removes = events[events["event"] == "remove"].set_index("instance_id")
    assert set(removes.index) == set(mine[:2])
    assert removes.loc[mine[0], "state"] == "terminated" and removes.loc[mine[1], "state"] == "stopped"
    assert set(events["lifecycle"]) == {"spot"}

    csv = store.export_event_csv("job-a", tmp_path / "job-a.csv")
    loaded = load_trace(csv)
    direct = to_intervals(store.fleet_trace("job-a"))
    assert loaded["available"].tolist() == direct["available"].tolist()
    assert int(loaded["available"].iloc[-1]) == 2  # 4 launched, 2 gone
    assert int(loaded["n_in"].sum()) == 4 and int(loaded["n_out"].sum()) == 2
    assert store.fleet_trace("job-a").start_time == events["timestamp"].min()


def test_empty_fleet_and_empty_export(tmp_path: Path) -> None:
    store = TraceStore(tmp_path / "store")
    with mock_aws():
        result = SpotCollector(regions=[REGION], job_tag="nobody", store=store).collect_fleet()
    assert result.ok and result.rows_written == {"fleet_events": 0} and not result.unsupported
    assert store.parts("fleet_events") == []
    with pytest.raises(ValueError, match="no fleet events"):
        store.export_event_csv("nobody", tmp_path / "x.csv")


# ------------------------------------------------------------------- fleet (stubbed interruptions)

_CODES = {"pending": 0, "running": 16, "shutting-down": 32, "terminated": 48, "stopping": 64, "stopped": 80}


def inst(iid: str, state: str, launched: datetime, transition: datetime | None = None, reason: str = "") -> dict:
    d = {
        "InstanceId": iid,
        "State": {"Name": state, "Code": _CODES[state]},
        "LaunchTime": launched,
        "InstanceType": "p3.2xlarge",
        "Placement": {"AvailabilityZone": "us-east-1a"},
        "InstanceLifecycle": "spot",
        "SpotInstanceRequestId": f"sir-{iid}",
        "StateTransitionReason": f"User initiated ({transition:%Y-%m-%d %H:%M:%S} GMT)" if transition else "",
    }
    if reason:
        d["StateReason"] = {"Code": reason, "Message": reason}
    return d


def round_trip(stub: Stubber, instances: list[dict], ids: list[str], requests: list[dict]) -> None:
    stub.add_response(
        "describe_instances",
        {"Reservations": [{"Instances": instances}]} if instances else {"Reservations": []},
        {"Filters": [{"Name": "tag:parcae:job", "Values": ["job-x"]}]},
    )
    stub.add_response(
        "describe_spot_instance_requests",
        {"SpotInstanceRequests": requests},
        {"Filters": [{"Name": "instance-id", "Values": ids}]},
    )


def spot_request(iid: str, code: str, when: datetime) -> dict:
    return {
        "InstanceId": iid,
        "SpotInstanceRequestId": f"sir-{iid}",
        "State": "active",
        "Status": {"Code": code, "UpdateTime": when, "Message": code},
    }


def test_fleet_interruptions_vanishing_and_short_lives(tmp_path: Path) -> None:
    """moto cannot emit interruption notices, so the rounds are stubbed with times we control."""
    m = lambda minutes: T0 + timedelta(minutes=minutes)  # noqa: E731
    col, stub = stubbed(tmp_path)
    # round 1: a and b run
    round_trip(
        stub,
        [inst("i-a", "running", m(0)), inst("i-b", "running", m(0.5))],
        ["i-a", "i-b"],
        [spot_request("i-a", "fulfilled", m(0)), spot_request("i-b", "fulfilled", m(0.5))],
    )
    # round 2: a gets its two-minute notice (still running), b was terminated by us, c came up
    round_trip(
        stub,
        [
            inst("i-a", "running", m(0)),
            inst("i-b", "terminated", m(0.5), m(4), "Client.UserInitiatedShutdown"),
            inst("i-c", "running", m(2)),
        ],
        ["i-a", "i-b", "i-c"],
        [spot_request("i-a", "marked-for-termination", m(3))],
    )
    # round 3: a terminated (already recorded), c vanished, d lived and stopped between two rounds
    r3 = [
        inst("i-a", "terminated", m(0), m(5), "Server.SpotInstanceTermination"),
        inst("i-d", "stopped", m(6), m(6.5), "Server.SpotInstanceShutdown"),
    ]
    round_trip(stub, r3, ["i-a", "i-c", "i-d"], [])
    # round 4: the same answer again writes nothing
    stub.add_response("describe_instances", {"Reservations": [{"Instances": r3}]})
    stub.add_response(
        "describe_spot_instance_requests",
        {"SpotInstanceRequests": []},
        {"Filters": [{"Name": "instance-id", "Values": ["i-a", "i-d"]}]},
    )

    written = [col.collect_fleet(now=m(t)).rows_written["fleet_events"] for t in (1, 5, 7, 8)]
    stub.assert_no_pending_responses()
    assert written == [2, 3, 3, 0]

    events = col.store.fleet_events("job-x")
    reasons = {(r.instance_id, r.event): r.reason for r in events.itertuples()}
    assert reasons[("i-a", "remove")] == "marked-for-termination"
    assert reasons[("i-b", "remove")] == "Client.UserInitiatedShutdown"
    assert reasons[("i-c", "remove")] == "vanished"
    assert reasons[("i-d", "remove")] == "Server.SpotInstanceShutdown"

    csv = col.store.export_event_csv("job-x", tmp_path / "fleet.csv")
    assert csv.read_text().splitlines() == [
        "0,add,i-a",
        "30000,add,i-b",
        "120000,add,i-c",
        "180000,remove,i-a",
        "240000,remove,i-b",
        "360000,add,i-d",
        "390000,remove,i-d",
        "420000,remove,i-c",
    ]
    table = load_trace(csv)
    assert table["available"].tolist() == [2, 2, 3, 2, 1, 1, 1, 0]
    assert table["n_in"].tolist() == [2, 0, 1, 0, 0, 0, 1, 0]
    assert to_intervals(col.store.fleet_trace("job-x"))["available"].tolist() == table["available"].tolist()
    assert col.store.fleet_trace("job-x").start_time == pd.Timestamp(T0)


def test_restart_between_rounds_is_a_remove_and_an_add(tmp_path: Path) -> None:
    """A stop+start unseen by any round shows as a newer LaunchTime; the export orders remove before add."""
    store = TraceStore(tmp_path)
    base = {
        "region": REGION,
        "instance_type": "p3.2xlarge",
        "az": "us-east-1a",
        "lifecycle": "spot",
        "spot_request_id": "",
    }
    known = {"i-a": {**base, "instance_id": "i-a", "event": "add", "timestamp": pd.Timestamp(T0)}}
    restarted = InstanceObservation("i-a", REGION, "running", pd.Timestamp(T0 + timedelta(minutes=10)))
    rows = fleet_transitions(
        [restarted], known, {}, now=pd.Timestamp(T0 + timedelta(minutes=11)), job_tag="j", region=REGION
    )
    assert [(r["event"], r["timestamp"]) for r in rows] == [
        ("remove", restarted.launch_time),
        ("add", restarted.launch_time),
    ]
    store.append(
        "fleet_events", [{**known["i-a"], "job_tag": "j", "state": "running", "reason": "running", "observed_at": T0}]
    )
    store.append("fleet_events", rows)
    csv = store.export_event_csv("j", tmp_path / "j.csv")
    assert csv.read_text().splitlines() == ["0,add,i-a", "600000,remove,i-a", "600000,add,i-a"]
    assert read_event_csv(csv).counts.tolist() == [1, 1]


# ----------------------------------------------------------------------------------------- prices


def test_prices_with_moto_and_dedup(tmp_path: Path) -> None:
    store = TraceStore(tmp_path)
    with mock_aws():
        col = SpotCollector(regions=[REGION], instance_types=["m5.large"], store=store)
        end = datetime.now(UTC)
        first = col.collect_prices(end - timedelta(hours=1), end)
        again = col.collect_prices(end - timedelta(hours=1), end)
    assert first.ok and first.rows_written["spot_prices"] > 0
    assert again.ok and again.rows_written == {"spot_prices": 0}
    prices = store.read("spot_prices")
    assert len(prices) == first.rows_written["spot_prices"]
    assert no_duplicate_keys(prices, ["instance_type", "az", "product", "timestamp"])
    assert set(prices["instance_type"]) == {"m5.large"} and (prices["price"] > 0).all()
    with pytest.raises(ValueError, match="empty price window"):
        col.collect_prices(end, end)


def test_a_collection_round_writes_each_table_then_compacts(tmp_path: Path) -> None:
    store = TraceStore(tmp_path)
    for i in range(COMPACT_AT - 2):  # another job's fleet, a part per round: two rounds short of compaction
        row = {"job_tag": "job-other", "region": REGION, "instance_id": f"i-{i:04d}", "event": "add",
               "timestamp": T0 + timedelta(minutes=i), "state": "running", "reason": "running",
               "instance_type": "m5.large", "az": "us-east-1a", "lifecycle": "spot", "spot_request_id": "",
               "observed_at": T0 + timedelta(minutes=i)}  # fmt: skip
        store.append("fleet_events", [row])
    with mock_aws():
        ec2 = boto3.client("ec2", region_name=REGION)
        launch(ec2, 2, {"parcae:job": "job-r"})
        col = SpotCollector(regions=[REGION], instance_types=["m5.large"], job_tag="job-r", store=store)
        first = col.collect_round(timedelta(hours=1), 4)
        assert list(first.results) == ["fleet_events", "spot_prices", "placement_scores"]
        assert first.results["fleet_events"].rows_written == {"fleet_events": 2}
        assert first.results["spot_prices"].rows_written["spot_prices"] > 0
        assert first.errors == [] and len(first.unsupported) == 1  # moto has no placement scores
        assert not any(first.compacted.values())  # COMPACT_AT - 1 fleet parts: under the threshold
        prices = store.read("spot_prices")
        ec2.terminate_instances(InstanceIds=launch(ec2, 1, {"parcae:job": "job-r"}))
        second = col.collect_round(timedelta(hours=1), 4)
    assert second.results["fleet_events"].rows_written == {"fleet_events": 2}  # launched and gone between rounds
    # the prices all known (no second part), the fleet's COMPACT_AT parts merged into one
    assert {t: n for t, n in second.compacted.items() if n} == {"fleet_events": COMPACT_AT - 1}
    assert len(store.parts("fleet_events")) == 1 and len(store.read("fleet_events")) == COMPACT_AT - 2 + 4
    assert store.read("spot_prices").equals(prices)


def price(az: str, hour: int, value: str = "0.9") -> dict:
    return {
        "AvailabilityZone": az,
        "InstanceType": "p3.2xlarge",
        "ProductDescription": "Linux/UNIX",
        "SpotPrice": value,
        "Timestamp": T0 + timedelta(hours=hour),
    }


def test_prices_follow_every_page_and_empty_answers_are_fine(tmp_path: Path) -> None:
    col, stub = stubbed(tmp_path)
    stub.add_response(
        "describe_spot_price_history",
        {"SpotPriceHistory": [price("us-east-1a", 0), price("us-east-1b", 0)], "NextToken": "p2"},
    )
    stub.add_response(
        "describe_spot_price_history",
        {"SpotPriceHistory": [price("us-east-1a", 1)], "NextToken": ""},
        {
            "InstanceTypes": ["p3.2xlarge"],
            "ProductDescriptions": ["Linux/UNIX"],
            "StartTime": T0,
            "EndTime": T0 + timedelta(days=1),
            "NextToken": "p2",
        },
    )
    stub.add_response("describe_spot_price_history", {"SpotPriceHistory": []})
    assert col.collect_prices(T0, T0 + timedelta(days=1)).rows_written == {"spot_prices": 3}
    empty = col.collect_prices(T0, T0 + timedelta(days=1))
    assert empty.ok and empty.rows_written == {"spot_prices": 0}
    stub.assert_no_pending_responses()
    assert len(col.store.parts("spot_prices")) == 1


# -------------------------------------------------------------------------------- placement scores


def test_placement_scores_unsupported_by_moto(tmp_path: Path) -> None:
    store = TraceStore(tmp_path)
    with mock_aws():
        result = SpotCollector(regions=[REGION], store=store).collect_placement_scores(4)
    assert result.ok and result.rows_written == {"placement_scores": 0}
    assert len(result.unsupported) == 1 and "not supported by this endpoint" in result.unsupported[0]
    assert store.parts("placement_scores") == []


def test_placement_scores_recorded_and_client_errors_reported(tmp_path: Path) -> None:
    col, stub = stubbed(
        tmp_path, instance_types=["p3.2xlarge", "p3.8xlarge", "g5.xlarge"], regions=[REGION, "us-west-2"]
    )
    stub.add_response(
        "get_spot_placement_scores",
        {"SpotPlacementScores": [{"Region": REGION, "Score": 7}, {"Region": "us-west-2", "Score": 3}]},
        {
            "InstanceTypes": ["p3.2xlarge", "p3.8xlarge", "g5.xlarge"],
            "TargetCapacity": 8,
            "SingleAvailabilityZone": False,
            "RegionNames": [REGION, "us-west-2"],
        },
    )
    stub.add_client_error("get_spot_placement_scores", "UnauthorizedOperation", "not allowed")
    stub.add_client_error("get_spot_placement_scores", "InvalidAction", "no such action")
    ok = col.collect_placement_scores(8)
    assert ok.ok and ok.rows_written == {"placement_scores": 2}
    scores = col.store.read("placement_scores")
    assert scores.set_index("region")["score"].to_dict() == {REGION: 7, "us-west-2": 3}
    assert set(scores["instance_types"]) == {"g5.xlarge,p3.2xlarge,p3.8xlarge"}
    denied = col.collect_placement_scores(8)
    assert denied.errors and "UnauthorizedOperation" in denied.errors[0] and not denied.unsupported
    missing = col.collect_placement_scores(8)
    assert missing.ok and "not supported" in missing.unsupported[0]
    assert len(col.store.read("placement_scores")) == 2


# -------------------------------------------------------------------------------------- throttling

_THROTTLE_XML = (
    b'<?xml version="1.0" encoding="UTF-8"?><Response><Errors><Error><Code>RequestLimitExceeded</Code>'
    b"<Message>Request limit exceeded.</Message></Error></Errors><RequestID>r1</RequestID></Response>"
)
_PRICES_XML = (
    b'<?xml version="1.0" encoding="UTF-8"?>'
    b'<DescribeSpotPriceHistoryResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">'
    b"<requestId>r2</requestId><spotPriceHistorySet><item><instanceType>p3.2xlarge</instanceType>"
    b"<productDescription>Linux/UNIX</productDescription><spotPrice>0.918</spotPrice>"
    b"<timestamp>2026-01-01T00:00:00.000Z</timestamp><availabilityZone>us-east-1a</availabilityZone>"
    b"</item></spotPriceHistorySet><nextToken/></DescribeSpotPriceHistoryResponse>"
)


class _Body:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def stream(self, **_: object):
        yield self.data


def http_answers(col: SpotCollector, answers: list[tuple[int, bytes]]) -> list[int]:
    """Answer describe_spot_price_history at the HTTP layer, so botocore's retry loop sees each answer."""
    sent: list[int] = []

    def before_send(request, **_):
        status, body = answers[min(len(sent), len(answers) - 1)]
        sent.append(status)
        return AWSResponse(request.url, status, {}, _Body(body))

    col.client(REGION).meta.events.register("before-send.ec2.DescribeSpotPriceHistory", before_send)
    return sent


@pytest.fixture
def backoffs(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """botocore's retry backoffs, recorded instead of slept."""
    slept: list[float] = []
    monkeypatch.setattr(botocore.endpoint.time, "sleep", slept.append)
    return slept


def test_throttling_is_retried_by_botocore(tmp_path: Path, backoffs: list[float]) -> None:
    col = SpotCollector(regions=[REGION], store=TraceStore(tmp_path), endpoint_url=NOWHERE, max_attempts=3)
    sent = http_answers(col, [(503, _THROTTLE_XML), (200, _PRICES_XML)])
    result = col.collect_prices(T0, T0 + timedelta(days=1))
    assert sent == [503, 200] and len(backoffs) == 1
    assert result.ok and result.rows_written == {"spot_prices": 1}


def test_persistent_throttling_is_reported_and_writes_nothing(tmp_path: Path, backoffs: list[float]) -> None:
    col = SpotCollector(regions=[REGION], store=TraceStore(tmp_path), endpoint_url=NOWHERE, max_attempts=2)
    sent = http_answers(col, [(503, _THROTTLE_XML)])
    result = col.collect_prices(T0, T0 + timedelta(days=1))
    assert sent == [503, 503]
    assert result.rows_written == {"spot_prices": 0}
    assert len(result.errors) == 1 and "RequestLimitExceeded" in result.errors[0] and "2 attempt" in result.errors[0]
    assert col.store.parts("spot_prices") == []


def test_throttle_with_retries_disabled_then_success(tmp_path: Path) -> None:
    """Stubber answers above botocore's retry loop: with max_attempts=1 that is exactly one try."""
    col, stub = stubbed(tmp_path, max_attempts=1)
    stub.add_client_error("describe_spot_price_history", "RequestLimitExceeded", "slow down", 503)
    # a throttle on the second page must not leave the first page behind
    stub.add_response("describe_spot_price_history", {"SpotPriceHistory": [price("us-east-1a", 0)], "NextToken": "p2"})
    stub.add_client_error("describe_spot_price_history", "Throttling", "slow down", 400)
    stub.add_response("describe_spot_price_history", {"SpotPriceHistory": [price("us-east-1a", 0)]})
    window = (T0, T0 + timedelta(days=1))
    for code in ("RequestLimitExceeded", "Throttling"):
        failed = col.collect_prices(*window)
        assert failed.rows_written == {"spot_prices": 0} and code in failed.errors[0]
        assert col.store.parts("spot_prices") == []
    assert col.collect_prices(*window).rows_written == {"spot_prices": 1}
    stub.assert_no_pending_responses()


def test_failed_region_does_not_block_the_others(tmp_path: Path) -> None:
    col = SpotCollector(
        regions=[REGION, "eu-west-1"], job_tag="job-x", store=TraceStore(tmp_path), endpoint_url=NOWHERE, max_attempts=1
    )
    east, west = Stubber(col.client(REGION)), Stubber(col.client("eu-west-1"))
    east.add_response("describe_instances", {"Reservations": [{"Instances": [inst("i-a", "running", T0)]}]})
    east.add_response("describe_spot_instance_requests", {"SpotInstanceRequests": []})
    west.add_client_error("describe_instances", "ThrottlingException", "slow down", 400)
    with east, west:
        result = col.collect_fleet(now=T0)
    assert result.rows_written == {"fleet_events": 1}
    assert len(result.errors) == 1 and "describe_instances[eu-west-1]" in result.errors[0]


# ------------------------------------------------------------------------------------ credentials


def test_missing_credentials_name_the_fix(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    col = SpotCollector(store=TraceStore(tmp_path), endpoint_url=NOWHERE)
    for collect in (
        col.collect_fleet,
        lambda: col.collect_prices(T0, T0 + timedelta(hours=1)),
        lambda: col.collect_placement_scores(1),
    ):
        with pytest.raises(CollectError, match="no AWS credentials") as info:
            collect()
        assert "AWS_PROFILE" in str(info.value) and "AWS_ACCESS_KEY_ID" in str(info.value)
    assert not (tmp_path / "fleet_events").exists()


def test_missing_region_names_the_fix(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("AWS_REGION")
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    with pytest.raises(CollectError, match="AWS_REGION"):
        SpotCollector(store=TraceStore(tmp_path)).collect_fleet()


# ------------------------------------------------------------------------------------ moto_server


def test_round_trip_against_moto_server_on_loopback(tmp_path: Path) -> None:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        assert host == "127.0.0.1"
        endpoint = f"http://127.0.0.1:{port}"
        session = boto3.Session()  # credentials and region from the (faked) environment
        ec2 = session.client("ec2", endpoint_url=endpoint)
        store = TraceStore(tmp_path / "store")
        col = SpotCollector(
            session, instance_types=["m5.large"], job_tag="srv", store=store, endpoint_url=endpoint, max_attempts=2
        )
        sent_to: list[str] = []

        def loopback_only(request, **_):
            sent_to.append(request.url)
            assert request.url.startswith(endpoint + "/"), request.url  # never anything but moto_server

        col.client(REGION).meta.events.register("before-send", loopback_only)
        ids = launch(ec2, 2, {"parcae:job": "srv"})
        assert col.collect_fleet().rows_written == {"fleet_events": 2}
        ec2.terminate_instances(InstanceIds=ids[:1])
        assert col.collect_fleet().rows_written == {"fleet_events": 1}
        assert col.collect_fleet().rows_written == {"fleet_events": 0}
        end = datetime.now(UTC)
        assert col.collect_prices(end - timedelta(hours=1), end).rows_written["spot_prices"] > 0
        scores = col.collect_placement_scores(2)  # moto_server answers HTTP 500 with an HTML page
        assert scores.rows_written == {"placement_scores": 0} and scores.unsupported and not scores.errors
        assert len(sent_to) >= 7
    finally:
        server.stop()
    table = load_trace(store.export_event_csv("srv", tmp_path / "srv.csv"))
    assert int(table["n_in"].sum()) == 2 and int(table["n_out"].sum()) == 1
    assert int(table["available"].iloc[-1]) == 1


def test_the_collector_and_the_spot_provider_read_one_list_of_interruption_codes():
    """One definition (forecasting.ec2): a warning, the cloud's reclaims (a fault-injection experiment's too), and
    never the owner's own doing."""
    import forecasting

    warned = ["marked-for-termination", "marked-for-stop", "marked-for-hibernation"]
    reclaimed = [
        "instance-terminated-no-capacity",
        "instance-stopped-by-price",
        "instance-terminated-by-experiment",
        "instance-hibernated-capacity-oversubscribed",
        "instance-terminated-launch-group-constraint",
    ]
    ours = [
        "instance-terminated-by-user",
        "instance-stopped-by-user",
        "instance-terminated-by-schedule",
        "instance-terminated-by-service",
        "request-canceled-and-instance-running",
        "fulfilled",
    ]
    assert all(forecasting.SPOT_WARNING_RE.fullmatch(c) for c in warned)
    assert all(forecasting.SPOT_RECLAIMED_RE.fullmatch(c) for c in reclaimed)
    assert not any(forecasting.SPOT_WARNING_RE.fullmatch(c) or forecasting.SPOT_RECLAIMED_RE.fullmatch(c) for c in ours)
    assert not any(forecasting.SPOT_WARNING_RE.fullmatch(c) for c in reclaimed)
