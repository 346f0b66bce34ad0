"""The clients load tests, benchmarks and tests speak to omniray with (REST, WebSocket, WebRTC, a
browser) and what they say (speech, seeded workloads)."""
