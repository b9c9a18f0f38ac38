"""The Streamlit page, as testable modules; `app.py` only calls `page.main()`."""
