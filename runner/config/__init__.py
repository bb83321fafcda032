"""The run config: its schema and loading, the names it resolves to functions, and the fields they declare."""
