"""Stream processing: validation and dead-lettering, the ClickHouse sink, and the Faust app around them."""
