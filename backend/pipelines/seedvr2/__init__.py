"""SeedVR2 one-step video restoration: the recipe around the model (preprocess, colour fix, long-video batches) and
the pipeline that runs it. Importing the package imports nothing heavy; import the modules you need."""
