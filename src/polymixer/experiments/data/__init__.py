"""What every family's data shares: the cache the offline defaults are generated into, and the bad-sample policy."""
