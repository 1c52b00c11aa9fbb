"""The ocr family's experiment: handwritten text recognition (HTR-VT / HTR-VPoM / hybrid): IAM-style line folders and
the synthetic lines, train / eval / read, the OCR bench."""
