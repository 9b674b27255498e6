"""The eval suites: seeded agent worlds (records, tickets, fs_audit, injection), their text, the short-chat workload and JSONL user traces as a workload."""
