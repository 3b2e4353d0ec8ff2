from library.cluster_key import structural_key


def test_case_and_whitespace_do_not_matter():
    assert structural_key("  You see a Drawer 1.\n\nIt is  closed. ") == "you see a drawer 1. it is closed."


def test_instance_numbers_group_only_when_asked():
    one, two = "You are on countertop 1, holding apple 3.", "You are on countertop 2, holding apple 7."
    assert structural_key(one) != structural_key(two)
    assert structural_key(one, group_instance_numbers=True) == structural_key(two, group_instance_numbers=True)
    assert structural_key(one, group_instance_numbers=True) == "you are on countertop #, holding apple #."


def test_only_numbers_after_a_word_are_instances():
    # the rule is textual ('word N'), so counts after a word go too; a number after punctuation stays
    assert structural_key("Step 3 of 50: 12 items", group_instance_numbers=True) == "step # of #: 12 items"
