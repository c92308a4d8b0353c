"""A judge certificate, one idea per module: ``people`` (several people's labels per item), ``agreement`` (people
against people, the panel beside each), ``alt_test`` (the alternative annotator test), ``report`` (``chateval
certify``), ``certificate`` (the card's certificate), ``gates`` and ``measure`` (what registering requires).
"""
