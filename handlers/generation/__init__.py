"""The generator model kind: request bodies (``requests``), the model and its files (``model``), the decoding loop
(``decoding``) and streamed text pieces (``streaming``)."""
