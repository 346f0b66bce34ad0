"""Realtime voice sessions: the OpenAI Realtime protocol (typed events) and the session that runs it."""
