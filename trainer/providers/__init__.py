"""The registry of instance providers: where a job's instances come from, in one place.

Owns: `Provider` (a name, its options' check, how it builds the job's instances, the grace of its preemption
notices, its live fleet if it runs one), `provider_of` (a job's provider, checked against the job) and `PROVIDERS` —
`local` (worker processes on this machine), `hosts` (instance agents on machines you have, over ssh:
`trainer.providers.hosts`), `aws` (EC2 spot instances through boto3: `trainer.providers.aws`), `market` (a live fleet
under a local spot market whose capacity follows a trace the job never reads: `trainer.providers.market`). The
command line, the flows, the tasks and the settings checks all look providers up here, so each supports every
provider it holds.
Must not touch: the providers' own machinery (imported only when a provider is used, so that looking a name up
costs nothing), training, the coordinator.

A new provider: write its `RemoteJob` builder (see `trainer.providers.agent.RemoteJob`), then
`register_provider(Provider(name, summary, check, job, notice_grace_s))`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainer.config import ConfigError, JobConfig

if TYPE_CHECKING:
    from trainer.providers.agent import RemoteJob
    from trainer.providers.fleet import Fleet, FleetSetup

#: A preemption notice's grace when the provider has none of its own: GCP's 30 s (AWS gives two minutes).
DEFAULT_NOTICE_GRACE_S = 30.0


class ProviderError(ValueError):
    """A provider's options that cannot work: the message names the option and the fix."""


@dataclass(frozen=True)
class Provider:
    """One place instances come from. `check(options)` raises `ProviderError` for options that cannot work (before
    any instance starts); `job(options)` builds the job's instances elsewhere (None: local worker processes);
    `notice_grace_s(options)` is how long its preemption notices come before the instance goes. A provider that
    runs a live fleet (`trainer.providers.fleet`) of local processes builds it with `fleet(options, setup)`; one
    whose fleet runs elsewhere has `remote_fleet` (its `RemoteJob.fleet` builds it); one whose instances only the
    cloud decides has `replays` False (it runs no trace replay and no scripted events)."""

    name: str
    summary: str
    check: Callable[[Mapping[str, Any]], None]
    job: Callable[[Mapping[str, Any]], RemoteJob | None]
    notice_grace_s: Callable[[Mapping[str, Any]], float] = lambda _options: DEFAULT_NOTICE_GRACE_S
    fleet: Callable[[Mapping[str, Any], FleetSetup], Fleet] | None = None
    replays: bool = True
    remote_fleet: bool = False  # its `RemoteJob` builds a live fleet of instances elsewhere (`RemoteJob.fleet`)
    # the instance type a live fleet's instances are (its price counts the fleet's cost); None: no type to price
    instance_type: Callable[[Mapping[str, Any]], str | None] = lambda _options: None

    @property
    def runs_fleet(self) -> bool:
        return self.fleet is not None or self.remote_fleet


PROVIDERS: dict[str, Provider] = {}


def register_provider(provider: Provider) -> Provider:
    if provider.name in PROVIDERS:
        raise ValueError(f"provider {provider.name!r} is registered already")
    PROVIDERS[provider.name] = provider
    return provider


def provider(name: str) -> Provider:
    """The registered provider `name`, or `ProviderError` listing the known ones."""
    try:
        return PROVIDERS[name]
    except KeyError:
        raise ProviderError(f"unknown provider {name!r}; choose one of {', '.join(PROVIDERS)}") from None


def provider_of(config: JobConfig) -> Provider:
    """The job's provider, checked before anything starts: registered, its options workable, and running what the
    job asks (a live fleet, or a trace replay and scripted events). Raises `ConfigError` naming the field and the
    fix. Here, not in `JobConfig`'s own checks: the config is the ground every provider stands on, so it cannot look
    them up."""
    name, options = config.provider.name, config.provider.options
    if name not in PROVIDERS:
        raise ConfigError(f"provider.name: unknown provider {name!r}; choose one of {', '.join(PROVIDERS)}")
    chosen = PROVIDERS[name]
    try:
        chosen.check(options)
    except ProviderError as exc:
        raise ConfigError(f"provider.options: {exc}") from None
    if config.fleet.live and not chosen.runs_fleet:
        fleets = ", ".join(n for n, p in PROVIDERS.items() if p.runs_fleet)
        raise ConfigError(f"fleet: provider {name!r} runs no live fleet; choose one that does: {fleets}")
    if not config.fleet.live and not chosen.replays:
        raise ConfigError(f"provider.name: provider {name!r} runs a live fleet only; give fleet.max_instances "
                          "(parcae train --fleet N)")  # fmt: skip
    return chosen


def with_notice_grace(config: JobConfig) -> JobConfig:
    """`config` checked against its provider (`provider_of`), with the provider's notice grace
    (``control.notice_grace_s``; AWS: two minutes, a provider that says nothing: GCP's 30 s): how long a preemption
    notice comes ahead is the cloud's, so a job built from options or from a file without one takes it from here."""
    chosen = provider_of(config)
    return config.replace(control={"notice_grace_s": chosen.notice_grace_s(config.provider.options)})


def _only(options: Mapping[str, Any], allowed: set[str], name: str) -> None:
    extra = sorted(set(options) - allowed)
    if extra:
        known = ", ".join(sorted(allowed)) or "none"
        raise ProviderError(f"provider {name!r} has no option {extra[0]!r}; its options: {known}")


# ------------------------------------------------------------------------------------------------ local


def _check_local(options: Mapping[str, Any]) -> None:
    _only(options, set(), "local")


register_provider(Provider("local", "worker processes on this machine", _check_local, lambda _options: None))


# ------------------------------------------------------------------------------------------------ hosts

HOSTS_OPTIONS = {"hosts", "coordinator", "slots", "python", "workdir"}


def _hosts_args(options: Mapping[str, Any]) -> tuple[list[str], str, int, dict[str, Any]]:
    """(hosts, coordinator address, port, SshHosts keywords) from the hosts provider's options."""
    from trainer.runtime.store import is_loopback

    _only(options, HOSTS_OPTIONS, "hosts")
    hosts, where = options.get("hosts"), options.get("coordinator")
    if not hosts or not where:
        raise ProviderError("hosts and coordinator go together: the hosts to run on, and ADDRESS:PORT of this "
                            "machine as they reach it")  # fmt: skip
    if not isinstance(hosts, (str, list, tuple)):
        raise ProviderError(f"hosts: expected ssh destinations (a list, or 'a,b,c'), got {hosts!r}")
    names = hosts.split(",") if isinstance(hosts, str) else [str(h) for h in hosts]
    address, _, port = str(where).rpartition(":")
    if not address or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ProviderError(f"coordinator: expected ADDRESS:PORT (e.g. 10.0.0.5:29500), got {where!r}")
    if is_loopback(address):
        raise ProviderError(f"coordinator: {address!r} is a loopback address, which other hosts cannot reach; give "
                            "this machine's address on their network")  # fmt: skip
    kw = {k: options[k] for k in ("slots", "python", "workdir") if k in options}
    return names, address, int(port), kw


def _check_hosts(options: Mapping[str, Any]) -> None:
    from trainer.providers.hosts import SshHosts

    names, address, port, kw = _hosts_args(options)
    try:
        SshHosts(names, address, port, "-", **kw)  # validates the destinations and slots; starts nothing
    except ValueError as exc:
        raise ProviderError(str(exc)) from None


def _hosts_job(options: Mapping[str, Any]) -> RemoteJob:
    from trainer.providers.hosts import hosts_job

    names, address, port, kw = _hosts_args(options)
    return hosts_job(names, address, port, **kw)


register_provider(Provider("hosts", "instance agents on machines you have, started over ssh", _check_hosts,
                           _hosts_job))  # fmt: skip


# ------------------------------------------------------------------------------------------------ aws


def _aws_config(options: Mapping[str, Any]) -> Any:
    from trainer.providers.aws import AwsConfigError, AwsSpotConfig

    try:
        return AwsSpotConfig.from_mapping(options)
    except AwsConfigError as exc:
        raise ProviderError(f"{exc}; fix the provider's options (AwsSpotConfig's fields)") from None


def _aws_job(options: Mapping[str, Any]) -> RemoteJob:
    from trainer.providers.aws import aws_job

    return aws_job(_aws_config(options))


register_provider(Provider("aws", "EC2 spot instances through boto3", _aws_config, _aws_job,
                           lambda options: float(_aws_config(options).notice_s), remote_fleet=True,
                           instance_type=lambda options: str(_aws_config(options).instance_type)))  # fmt: skip


# ------------------------------------------------------------------------------------------------ market


def _market_options(options: Mapping[str, Any]) -> Any:
    from trainer.providers.market import MarketError, MarketOptions

    try:
        return MarketOptions.from_mapping(options)
    except MarketError as exc:
        raise ProviderError(str(exc)) from None


def _market_fleet(options: Mapping[str, Any], setup: FleetSetup) -> Fleet:
    from trainer.providers.market import MarketError, MarketFleet

    try:
        return MarketFleet(setup, _market_options(options))
    except MarketError as exc:
        raise ProviderError(str(exc)) from None


register_provider(Provider("market", "a live fleet under a local spot market that follows a trace the job never reads",
                           _market_options, lambda _options: None,
                           lambda options: float(_market_options(options).notice_s), fleet=_market_fleet,
                           replays=False,
                           instance_type=lambda options: str(_market_options(options).instance_type)))  # fmt: skip
