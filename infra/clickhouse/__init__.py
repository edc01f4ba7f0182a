"""ClickHouse access: client factory, ordered SQL migrations, and the reader that respects one owner."""
