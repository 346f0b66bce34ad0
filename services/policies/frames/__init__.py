"""How a video clip becomes the frames an encoder sees: which instants are sampled (sampling.py),
which sampled frames are kept as key frames (keyframes.py), and at what size (sizing.py). Pure
numpy; the video pre-stage (services/stages/video.py) decodes and calls these."""
