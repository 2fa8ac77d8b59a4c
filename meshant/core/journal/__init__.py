"""What the core knows of its journal, without touching it: the archive index, the deferral
of young tasks' first writes, and the lease rules of a shared journal."""
