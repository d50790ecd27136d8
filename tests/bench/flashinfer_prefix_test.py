#!/usr/bin/env python3
"""bench/flashinfer_prefix.py's batch notation and page tables against tables written by hand.

The peer's timings are only comparable with pagoda's if FlashInfer reads the same tree: every
query's decode page table must be its ancestors' pages then its own, every cascade level must
group the queries under their ancestor of that level, and the unique bytes must count each node
once. These parts are pure Python (no torch, no GPU), so they run here.
"""
import os
import sys
import unittest

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench")
sys.path.insert(0, BENCH)
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import flashinfer_prefix as fp  # noqa: E402


class ParseTreeTest(unittest.TestCase):
    def test_levels(self):
        self.assertEqual(fp.parse_tree("1,4,16_128,256,1024"), ([1, 4, 16], [128, 256, 1024]))
        self.assertEqual(fp.parse_tree("256_4096"), ([256], [4096]))

    def test_rejected(self):
        for spec in ("1,4,16", "1,4_128", "1,4_128,x", "0,4_128,32", "2,3_64,32", "1_2_3"):
            with self.assertRaises(ValueError, msg=spec):
                fp.parse_tree(spec)

    def test_shared_nodes_fill_whole_pages(self):
        fp.check_page_multiples("1,4_32,20", [32, 20], 16)  # only the leaves end inside a page
        with self.assertRaises(ValueError):
            fp.check_page_multiples("1,4_20,16", [20, 16], 16)

    def test_split_trees(self):
        self.assertEqual(fp.split_trees(["1,2_32,16;256_4096", " 8_64 "]), ["1,2_32,16", "256_4096", "8_64"])

    def test_trees_come_from_the_command_line(self):
        # No list of its own: the benchmark's sets are pagoda's (`--list-trees`), passed in.
        self.assertEqual(fp.parse_args(["--out", "x.json", "--trees", "1,2_32,16;256_4096"]).trees,
                         ["1,2_32,16", "256_4096"])
        with self.assertRaises(SystemExit):
            fp.parse_args(["--out", "x.json"])
        self.assertEqual(fp.parse_args(["--out", "x.json", "--compile-only"]).trees, ["1,2_16,5"])


class LayoutTest(unittest.TestCase):
    # One root of 32 tokens (2 pages), 2 children of 16 (1 page), 4 queries of 20 (2 pages, the
    # second holding 4 tokens): query j sits below child j // 2.
    COUNTS, LENGTHS, PAGE = [1, 2, 4], [32, 16, 20], 16

    def setUp(self):
        self.lay = fp.build_layout(self.COUNTS, self.LENGTHS, self.PAGE, seed=5)
        self.nodes = self.lay["node_pages"]

    def test_every_page_once(self):
        self.assertEqual(self.lay["num_pages"], 2 + 2 * 1 + 4 * 2)
        self.assertEqual([len(p) for level in self.nodes for p in level], [2, 1, 1, 2, 2, 2, 2])
        self.assertEqual(sorted(p for level in self.nodes for pages in level for p in pages), list(range(12)))

    def test_decode_tables_read_the_ancestors_then_the_leaf(self):
        for j in range(4):
            want = self.nodes[0][0] + self.nodes[1][j // 2] + self.nodes[2][j]
            self.assertEqual(self.lay["tables"][j], want)
        d = self.lay["decode"]
        self.assertEqual(d["indptr"], [0, 5, 10, 15, 20])
        self.assertEqual(d["indices"], [p for t in self.lay["tables"] for p in t])
        self.assertEqual(d["last_page_len"], [68 - 4 * 16] * 4)
        self.assertEqual(self.lay["path_len"], 68)

    def test_cascade_levels_group_the_queries_by_ancestor(self):
        root, children, leaves = self.lay["levels"]
        self.assertEqual(root["qo_indptr"], [0, 4])
        self.assertEqual(children["qo_indptr"], [0, 2, 4])
        self.assertEqual(leaves["qo_indptr"], [0, 1, 2, 3, 4])
        self.assertEqual(root["kv_indptr"], [0, 2])
        self.assertEqual(children["kv_indptr"], [0, 1, 2])
        self.assertEqual(leaves["kv_indptr"], [0, 2, 4, 6, 8])
        self.assertEqual(children["kv_indices"], self.nodes[1][0] + self.nodes[1][1])
        self.assertEqual(root["last_page_len"], [16])
        self.assertEqual(children["last_page_len"], [16, 16])
        self.assertEqual(leaves["last_page_len"], [4] * 4)

    def test_seed_moves_the_pages_not_the_tree(self):
        other = fp.build_layout(self.COUNTS, self.LENGTHS, self.PAGE, seed=6)
        self.assertNotEqual(other["node_pages"], self.nodes)
        self.assertEqual(other["levels"][1]["qo_indptr"], self.lay["levels"][1]["qo_indptr"])


class UniqueBytesTest(unittest.TestCase):
    def test_each_node_once(self):
        # (32 + 2 x 16 + 4 x 20) tokens x 8 kv heads x 128 dims x 2 bytes x (K and V)
        self.assertEqual(fp.unique_kv_bytes([1, 2, 4], [32, 16, 20], 8, 128), 144 * 8 * 128 * 4)
        # 1,10_4096,416 at 32 kv heads: the 135.3 MB of bench/workloads/pat_reference.md
        self.assertEqual(fp.unique_kv_bytes([1, 10], [4096, 416], 32, 128), (4096 + 4160) * 32 * 128 * 4)


if __name__ == "__main__":
    unittest.main()
