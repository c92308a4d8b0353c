"""A saved evaluator: its files and card (``store``, ``card``, ``card_md``), what is checked when it is read
(``untrusted``, ``certificate``, ``pickled``, ``fetch``), and ``load()`` binding it to its LMs (``judge``,
``binding``, ``verdicts``, ``cascade``)."""
