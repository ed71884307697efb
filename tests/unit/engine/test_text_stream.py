"""Text streaming (localserve/engine/text_stream.py): UTF-8 held until whole, stop strings never
streamed, a chat format's leading space dropped."""

from __future__ import annotations

from localserve.engine.text_stream import TextStream


def push_all(stream: TextStream, *pieces: str | bytes) -> list[tuple[str, bool]]:
    return [stream.push(p if isinstance(p, bytes) else p.encode()) for p in pieces]


def test_plain_text_passes_through_without_stops():
    stream = TextStream(())
    assert push_all(stream, "Hello", ", ", "world") == [
        ("Hello", False),
        (", ", False),
        ("world", False),
    ]
    assert stream.text == "Hello, world"


def test_plain_text_passes_through_when_it_cannot_start_a_stop():
    stream = TextStream(("END",))
    assert push_all(stream, "abc", "xyz") == [("abc", False), ("xyz", False)]


def test_multibyte_character_split_across_pieces_is_released_only_when_complete():
    stream = TextStream(())
    euro = "€".encode()  # 3 bytes
    assert stream.push(euro[:1]) == ("", False)
    assert stream.push(euro[1:2]) == ("", False)
    assert stream.push(euro[2:] + b"!") == ("€!", False)
    assert stream.text == "€!"


def test_multibyte_character_split_is_also_held_with_stop_strings():
    stream = TextStream(("END",))
    e_acute = "é".encode()
    assert stream.push(b"caf" + e_acute[:1]) == ("caf", False)
    assert stream.push(e_acute[1:]) == ("é", False)


def test_stop_string_is_not_streamed_and_ends_the_stream():
    stream = TextStream(("END",))
    assert stream.push(b"answerEND trailing") == ("answer", True)
    assert stream.text == "answer"


def test_stop_string_split_across_pieces_is_not_streamed():
    stream = TextStream(("END",))
    assert push_all(stream, "xEN", "D") == [("x", False), ("", True)]
    assert stream.text == "x"


def test_stop_prefix_that_turns_out_not_to_be_a_stop_is_released():
    stream = TextStream(("END",))
    assert push_all(stream, "EN", "ding") == [("", False), ("ENding", False)]
    assert stream.text == "ENding"


def test_earliest_of_several_stop_strings_wins():
    stream = TextStream(("world", "lo"))
    assert stream.push(b"hello world") == ("hel", True)
    assert stream.stop_hit == "lo"  # which one ended it (the Anthropic API's stop_sequence)


def test_repeated_prefix_characters_hold_back_only_a_possible_stop():
    stream = TextStream(("aab",))
    assert push_all(stream, "aa", "a", "b") == [("", False), ("a", False), ("", True)]
    assert stream.text == "a"


def test_flush_releases_held_text():
    stream = TextStream(("END",))
    assert stream.push(b"the EN") == ("the ", False)
    assert stream.flush() == "EN"
    assert stream.text == "the EN"


def test_flush_replaces_an_incomplete_utf8_tail():
    stream = TextStream(())
    stream.push("é".encode()[:1])
    assert stream.flush() == "\ufffd"


def test_strip_space_drops_the_first_releases_leading_space_only():
    stream = TextStream((), strip_space=True)
    assert push_all(stream, " The", " capital", " is") == [
        ("The", False),
        (" capital", False),
        (" is", False),
    ]
    assert stream.text == "The capital is"
    assert TextStream(()).push(b" The") == (" The", False)  # off unless asked


def test_strip_space_drops_one_space_even_when_it_comes_alone():
    stream = TextStream((), strip_space=True)
    assert push_all(stream, " ", " two", "!") == [("", False), (" two", False), ("!", False)]
    stream = TextStream((), strip_space=True)
    assert push_all(stream, "  x") == [(" x", False)]  # one space is the format's, not two
    stream = TextStream((), strip_space=True)
    assert push_all(stream, "Paris", " ok") == [("Paris", False), (" ok", False)]


def test_strip_space_waits_for_a_whole_utf8_character():
    stream = TextStream(("\nUser:",), strip_space=True)
    euro = " €".encode()
    assert push_all(stream, euro[:2], euro[2:], " 5") == [("", False), ("€", False), (" 5", False)]


def test_stop_strings_see_the_space_and_held_text_is_stripped_once():
    # a stop that starts with the space still matches at the very start
    stream = TextStream((" Paris",), strip_space=True)
    assert stream.push(b" Paris is") == ("", True)
    # held back: "\n" may begin the format's stop; the space before it goes, the rest stays
    stream = TextStream(("\nUser:",), strip_space=True)
    assert push_all(stream, " \n", "Hi") == [("", False), ("\nHi", False)]
    stream = TextStream(("\nUser:",), strip_space=True)
    assert push_all(stream, " \n", "User:") == [("", False), ("", True)]
    # everything held back until the end: flush strips it
    stream = TextStream(("END",), strip_space=True)
    assert stream.push(b" EN") == ("", False)
    assert stream.flush() == "EN" and stream.text == "EN"
