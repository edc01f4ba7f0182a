"""The native Apache Kafka broker this project fetches from Maven Central and runs on loopback."""

from infra.kafka.broker import BrokerStatus, ClusterProbe, NativeKafka, probe_cluster

__all__ = ["BrokerStatus", "ClusterProbe", "NativeKafka", "probe_cluster"]
