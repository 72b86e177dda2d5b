"""shardline_ray.spec against the shipped examples and bad specs: the device counts that size the
placement group. No Ray cluster: runs in a second."""

from __future__ import annotations

import os
import sys
import tempfile
import unittest

import ray_support as rs
from shardline_ray.spec import SpecError, read_job_shape, resolve_checkpoint_dir


def example(name: str) -> str:
    return os.path.join(rs.source_dir(), "examples", name)


class ReadJobShapeTest(unittest.TestCase):
    def write(self, text: str) -> str:
        f = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
        self.addCleanup(os.unlink, f.name)
        f.write(text)
        f.close()
        return f.name

    def test_examples(self) -> None:
        sharded = read_job_shape(example("gpt-sharded.yaml"))
        self.assertEqual((sharded.kind, sharded.device_kind, sharded.max_devices,
                          sharded.min_devices, sharded.elastic), ("train", "cpu", 4, 4, False))
        elastic = read_job_shape(example("gpt-elastic.yaml"))
        self.assertEqual((elastic.max_devices, elastic.min_devices, elastic.elastic), (4, 2, True))
        self.assertEqual(read_job_shape(example("comm-check.yaml")).max_devices, 4)
        self.assertEqual(read_job_shape(example("serve.yaml")).max_devices, 2)  # tp 2 x pp 1

    def test_auto_takes_devices_from_the_flag(self) -> None:
        with self.assertRaisesRegex(SpecError, "give --devices N"):
            read_job_shape(example("gpt-auto.yaml"))
        self.assertEqual(read_job_shape(example("gpt-auto.yaml"), devices_flag=8).max_devices, 8)

    def test_the_flag_caps_a_fixed_world(self) -> None:
        self.assertEqual(read_job_shape(example("gpt-elastic.yaml"), devices_flag=3).max_devices, 3)

    def test_elastic_minimum_defaults_to_one_replica(self) -> None:
        path = self.write("name: j\nkind: train\nparallel: {tp: 2, pp: 2, dp: 3}\nelastic: {}\n")
        shape = read_job_shape(path)
        self.assertEqual((shape.max_devices, shape.min_devices), (12, 4))

    def test_cuda(self) -> None:
        path = self.write("name: j\nkind: train\ndevices: cuda\nparallel: {tp: 2}\n")
        self.assertEqual(read_job_shape(path).device_kind, "cuda")

    def test_bad_specs_say_what(self) -> None:
        with self.assertRaisesRegex(SpecError, "cannot read job spec"):
            read_job_shape("/nonexistent/spec.yaml")
        with self.assertRaisesRegex(SpecError, "not a job spec"):
            read_job_shape(example("gpt-tiny.yaml"))  # a `shardline train` spec
        with self.assertRaisesRegex(SpecError, r"parallel\.tp must be a positive integer"):
            read_job_shape(self.write("name: j\nkind: train\nparallel: {tp: two}\n"))
        with self.assertRaisesRegex(SpecError, "devices must be cpu or cuda"):
            read_job_shape(self.write("name: j\nkind: train\ndevices: tpu\n"))
        with self.assertRaisesRegex(SpecError, "not YAML"):
            read_job_shape(self.write("name: [\n"))

    def test_checkpoint_dir_resolves_against_the_work_dir(self) -> None:
        shape = read_job_shape(example("gpt-sharded.yaml"))
        self.assertEqual(resolve_checkpoint_dir(shape, "/shared/run"),
                         "/shared/run/checkpoints/gpt-sharded")


if __name__ == "__main__":
    sys.exit(0 if unittest.main(exit=False).result.wasSuccessful() else 1)
