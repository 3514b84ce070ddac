"""What the PyTorch peers share: exit statuses and an argparse that exits 64."""

import argparse
import sys

EXIT_USAGE = 64
EXIT_NO_GPU = 69


class UsageParser(argparse.ArgumentParser):
    """argparse, but usage errors exit 64 like the C++ benchmarks."""

    def error(self, message):
        self.print_usage(sys.stderr)
        sys.stderr.write("%s: %s\n" % (self.prog, message))
        sys.exit(EXIT_USAGE)
