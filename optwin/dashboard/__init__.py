"""The Streamlit exploration dashboard (`optwin dashboard --db DB`); streamlit loads only in app.py."""
