"""Tools around the backend that are not part of it: spawning rank processes, the calibration CLI."""
