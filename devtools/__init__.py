"""What the benchmarks and the test suite both run besides the broker (a throwaway PostgreSQL
cluster, a free loopback port): neither imports the other, and none of it ships in a wheel."""
