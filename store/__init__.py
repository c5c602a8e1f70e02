"""Everything that touches LanceDB: connections, tables, the writer lock, commits, in-flight markers."""
