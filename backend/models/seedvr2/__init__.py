"""SeedVR2 (3B and 7B one-step video restoration DiTs): window geometry, later the DiTs and the video VAE."""
