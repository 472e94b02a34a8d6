import unittest

import calc


class CalcTest(unittest.TestCase):
    def test_add(self) -> None:
        self.assertEqual(calc.add(2, 3), 5)

    def test_double(self) -> None:
        self.assertEqual(calc.double(4), 8)
