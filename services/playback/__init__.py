"""Live session state (playback, speech, barge-ins, reply gaps) that scheduling and KV policies read."""
