"""`python -m shardline_ray SPEC.yaml [options]`: see shardline_ray.launcher."""

import sys

from shardline_ray.launcher import main

if __name__ == "__main__":
    sys.exit(main())
