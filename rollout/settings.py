"""Settings of the platform, read once at the entry point from the environment (and .env)."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]


def _env(*names: str) -> AliasChoices:
    return AliasChoices(*names)


class Settings(BaseSettings):
    """Everything configurable, with the embedded single-machine stack as default.

    Library classes never read the environment; they take the values they need from an
    instance built by the CLI (or by tests).
    """

    model_config = SettingsConfigDict(frozen=True, extra="ignore", env_file=".env", populate_by_name=True)

    data_dir: Path = Field(default=Path(".data"), validation_alias=_env("ROLLOUT_DATA_DIR"))
    cache_dir: Path = Field(
        default=Path.home() / ".cache" / "rollout", validation_alias=_env("ROLLOUT_CACHE_DIR")
    )

    # ClickHouse: chdb://<path> (embedded engine, the default) or http(s)://user:pass@host:port
    # repr=False: a server URL may carry a password (Settings.describe() shows it masked).
    clickhouse_url_setting: str = Field(default="", repr=False, validation_alias=_env("CLICKHOUSE_URL"))
    clickhouse_database: str = Field(default="rollout", validation_alias=_env("CLICKHOUSE_DATABASE"))

    # Kafka: empty bootstrap servers means the native broker this project starts on 127.0.0.1.
    kafka_bootstrap_servers_setting: str = Field(default="", validation_alias=_env("KAFKA_BOOTSTRAP_SERVERS"))
    kafka_port: int = Field(default=19092, ge=1, le=65535, validation_alias=_env("ROLLOUT_KAFKA_PORT"))
    kafka_controller_port: int = Field(
        default=19093, ge=1, le=65535, validation_alias=_env("ROLLOUT_KAFKA_CONTROLLER_PORT")
    )
    kafka_version: str = Field(default="4.0.2", validation_alias=_env("ROLLOUT_KAFKA_VERSION"))
    kafka_heap: str = Field(default="768m", validation_alias=_env("ROLLOUT_KAFKA_HEAP"))
    kafka_security_protocol: SecurityProtocol = Field(
        default="PLAINTEXT", validation_alias=_env("KAFKA_SECURITY_PROTOCOL")
    )
    kafka_sasl_mechanism: SaslMechanism | None = Field(default=None, validation_alias=_env("KAFKA_SASL_MECHANISM"))
    kafka_sasl_username: str | None = Field(default=None, validation_alias=_env("KAFKA_SASL_USERNAME"))
    kafka_sasl_password: SecretStr | None = Field(default=None, validation_alias=_env("KAFKA_SASL_PASSWORD"))
    kafka_ssl_cafile: Path | None = Field(default=None, validation_alias=_env("KAFKA_SSL_CAFILE"))
    # The producer's on-disk spool for events sent while Kafka is unreachable (docs/reliability.md).
    # An unset (or empty) directory means <data_dir>/spool; a bound of 0 turns the spool off.
    spool_dir_setting: Path | None = Field(default=None, validation_alias=_env("ROLLOUT_SPOOL_DIR"))
    spool_max_bytes: int = Field(default=256 * 1024 * 1024, ge=0, validation_alias=_env("ROLLOUT_SPOOL_MAX_BYTES"))

    topic_prefix: str = Field(default="rollout", pattern=r"^[A-Za-z0-9._-]{1,100}$",
                              validation_alias=_env("ROLLOUT_TOPIC_PREFIX"))
    topic_partitions: int = Field(default=4, ge=1, le=1024, validation_alias=_env("ROLLOUT_TOPIC_PARTITIONS"))
    consumer_group: str = Field(default="rollout-worker", validation_alias=_env("ROLLOUT_CONSUMER_GROUP"))

    # The worker's loopback web port: stats and the read-only SQL endpoint (the embedded
    # ClickHouse is owned by one process, so other processes read through it).
    worker_web_port: int = Field(default=16066, ge=1, le=65535, validation_alias=_env("ROLLOUT_WORKER_WEB_PORT"))
    # How often the worker logs its totals and, while behind its topics, its catch-up line (streams/progress.py).
    worker_report_seconds: float = Field(default=10.0, ge=0.1, le=3600,
                                         validation_alias=_env("ROLLOUT_WORKER_REPORT_SECONDS"))

    # With the embedded engine, hand the pages of its library the worker does not use back to the kernel
    # this often (streams/memory.py LibraryPager; the first time 5 s after start); 0: never.
    engine_page_out_seconds: float = Field(default=60.0, ge=0,
                                           validation_alias=_env("ROLLOUT_ENGINE_PAGE_OUT_SECONDS"))

    sink_batch_size: int = Field(default=10000, ge=1, validation_alias=_env("ROLLOUT_SINK_BATCH_SIZE"))
    sink_batch_seconds: float = Field(default=0.5, gt=0, validation_alias=_env("ROLLOUT_SINK_BATCH_SECONDS"))
    # Direct ingestion hands a batch to the owner as soon as the previous one is stored, once it is this
    # old (group commit): live batches follow the owner's pace instead of waiting out sink_batch_seconds.
    # Larger means fewer, larger inserts at low rates; 0 means as soon as the owner is free.
    sink_batch_min_seconds: float = Field(default=0.1, ge=0,
                                          validation_alias=_env("ROLLOUT_SINK_BATCH_MIN_SECONDS"))
    # How the worker reads the raw topics: a confluent-kafka consumer in batches below Faust's stream
    # (streams/direct.py), or a Faust agent (stream.take_events). Direct is the default: on the 2-core
    # reference machine a Faust-agent worker fell behind a steady 5,000 events/s (docs/architecture.md).
    ingest: Literal["faust", "direct"] = Field(default="direct", validation_alias=_env("ROLLOUT_INGEST"))
    # Direct ingestion holds back raw messages more than this far ahead in event time of the other
    # partitions, so a backlog is read in about the order it happened (streams/align.py); 0: off.
    ingest_align_seconds: float = Field(default=60.0, ge=0, validation_alias=_env("ROLLOUT_INGEST_ALIGN_SECONDS"))
    # Direct ingestion fetches ahead by at most this much (librdkafka's queued.max.messages.kbytes; its
    # default, 64 MiB, sits in the worker's memory); 16 MiB reads replays 7-8% faster (docs/performance.md).
    ingest_prefetch_kbytes: int = Field(default=4096, ge=64, le=2_097_151,
                                        validation_alias=_env("ROLLOUT_INGEST_PREFETCH_KBYTES"))

    # Event times further ahead of the worker's clock are dead-lettered (clock errors).
    max_future_seconds: float = Field(default=86400.0, gt=0, validation_alias=_env("ROLLOUT_MAX_FUTURE_SECONDS"))
    # Fault injection for reliability tests: ClickHouse calls fail while <data_dir>/faults/clickhouse exists.
    fault_injection: bool = Field(default=False, validation_alias=_env("ROLLOUT_FAULT_INJECTION"))

    # Metrics (event time).
    metrics_window_seconds: int = Field(
        default=60, ge=1, le=86400, validation_alias=_env("ROLLOUT_METRICS_WINDOW_SECONDS")
    )
    verdict_timeout_seconds: float = Field(
        default=600.0, gt=0, validation_alias=_env("ROLLOUT_VERDICT_TIMEOUT_SECONDS")
    )
    default_staleness_bound: int = Field(default=2, ge=0, validation_alias=_env("ROLLOUT_DEFAULT_STALENESS_BOUND"))
    regression_min_decided: int = Field(default=30, ge=1, validation_alias=_env("ROLLOUT_REGRESSION_MIN_DECIDED"))
    regression_min_drop: float = Field(default=0.10, ge=0, le=1, validation_alias=_env("ROLLOUT_REGRESSION_MIN_DROP"))
    regression_alpha: float = Field(default=0.01, gt=0, lt=1, validation_alias=_env("ROLLOUT_REGRESSION_ALPHA"))

    @field_validator("data_dir", "cache_dir")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        return value.expanduser().resolve()

    @field_validator("spool_dir_setting", mode="before")
    @classmethod
    def _unset_when_empty(cls, value: object) -> object:
        return None if value == "" else value

    @cached_property
    def clickhouse_url(self) -> str:
        """The ClickHouse URL in force: the setting, or the embedded engine under the data folder."""
        if self.clickhouse_url_setting:
            return self.clickhouse_url_setting
        return f"chdb://{self.data_dir / 'clickhouse'}"

    @property
    def clickhouse_embedded(self) -> bool:
        """True when ClickHouse is the in-process engine (one process may own it)."""
        return self.clickhouse_url.startswith("chdb://")

    @property
    def kafka_native(self) -> bool:
        """True when Kafka is the broker this project starts itself."""
        return not self.kafka_bootstrap_servers_setting

    @property
    def spool_dir(self) -> Path:
        """The producer spool's directory in force: the setting, or ``spool`` under the data folder."""
        if self.spool_dir_setting is not None:
            return self.spool_dir_setting.expanduser().resolve()
        return self.data_dir / "spool"

    @property
    def kafka_bootstrap_servers(self) -> str:
        """Bootstrap servers in force: the setting, or the native broker on loopback."""
        return self.kafka_bootstrap_servers_setting or f"127.0.0.1:{self.kafka_port}"

    def kafka_client_config(self) -> dict[str, str]:
        """librdkafka (confluent-kafka) connection and security settings; holds the secret, never log it."""
        conf: dict[str, str] = {
            "bootstrap.servers": self.kafka_bootstrap_servers,
            "security.protocol": self.kafka_security_protocol.lower(),
        }
        if self.kafka_sasl_mechanism:
            conf["sasl.mechanism"] = self.kafka_sasl_mechanism
        if self.kafka_sasl_username is not None:
            conf["sasl.username"] = self.kafka_sasl_username
        if self.kafka_sasl_password is not None:
            conf["sasl.password"] = self.kafka_sasl_password.get_secret_value()
        if self.kafka_ssl_cafile is not None:
            conf["ssl.ca.location"] = str(self.kafka_ssl_cafile)
        return conf

    def describe(self) -> dict[str, str]:
        """Settings safe to print: secrets masked."""
        shown = {
            "data_dir": str(self.data_dir),
            "clickhouse_url": _mask_url(self.clickhouse_url),
            "clickhouse_database": self.clickhouse_database,
            "kafka_bootstrap_servers": self.kafka_bootstrap_servers,
            "kafka_security_protocol": self.kafka_security_protocol,
            "kafka_sasl_mechanism": self.kafka_sasl_mechanism or "-",
            "kafka_sasl_password": "***" if self.kafka_sasl_password else "-",
            "topic_prefix": self.topic_prefix,
        }
        return shown


def _mask_url(url: str) -> str:
    """Hide a password in scheme://user:password@host URLs."""
    if "://" not in url or "@" not in url:
        return url
    scheme, rest = url.split("://", 1)
    creds, host = rest.rsplit("@", 1)
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}"
