"""Write the binary files of the sample corpus (PDF, DOCX) from the text below; run once, commit the output."""

from __future__ import annotations

from pathlib import Path

import docx
import pikepdf

SAMPLE = Path(__file__).resolve().parent.parent / "data" / "sample"

REPORT_PAGES = [
    [
        ("H", "Annual regatta report 2025"),
        ("P", "The Northwind autumn regatta was held on 13 and 14 September 2025 with 46 boats"),
        ("L", "in three fleets. Racing was sailed in a steady south-westerly breeze of 8 to 14 knots,"),
        ("L", "with seven races for the dinghies and five for the keelboats over the two days."),
        ("H", "Results"),
        ("P", "The keelboat fleet was won by Petrel, helmed by Ines Alvarez, with four first places."),
        ("L", "Second place went to Kittiwake after a protest about a port-starboard incident at the"),
        ("L", "windward mark was dismissed by the jury on Saturday evening."),
        ("P", "The Laser fleet was won by Tom Okafor after a tie-break on the final race, and the"),
        ("L", "Optimist fleet by twelve-year-old Maya Lindqvist, who won every race she started."),
    ],
    [
        ("H", "Finances"),
        ("P", "Entry fees raised 3,680 euros. Committee boat fuel and trophies cost 2,150 euros,"),
        ("L", "so the regatta closed with a surplus of 1,530 euros, which the committee has given"),
        ("L", "to the youth training fund for new Optimist sails."),
        ("H", "Lessons for next year"),
        ("P", "The race committee asks for a second mark-laying launch, because the course could"),
        ("L", "not be moved quickly when the wind shifted forty degrees on Sunday afternoon."),
        ("P", "Volunteers asked for an earlier briefing and for printed sailing instructions at the"),
        ("L", "registration desk, since the club's web page was slow to load on the slipway."),
    ],
]

def _content(lines: list[tuple[str, str]]) -> bytes:
    ops, y = [], 780
    for kind, text in lines:
        size = 18 if kind == "H" else 11
        # Wide gaps around headings and between paragraphs so pdfminer keeps them apart.
        y -= {"H": 48, "P": 34, "L": 15}[kind]
        safe = text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
        ops.append(f"BT /F1 {size} Tf 56 {y} Td ({safe}) Tj ET")
    return "\n".join(ops).encode("latin-1")


def write_pdf(path: Path) -> None:
    """Write the two-page regatta report, encrypted with an empty user password."""
    pdf = pikepdf.new()
    font = pdf.make_indirect(pikepdf.Dictionary(Type=pikepdf.Name.Font, Subtype=pikepdf.Name.Type1,
                                                BaseFont=pikepdf.Name.Helvetica, Encoding=pikepdf.Name.WinAnsiEncoding))
    for lines in REPORT_PAGES:
        page = pikepdf.Dictionary(
            Type=pikepdf.Name.Page, MediaBox=[0, 0, 595, 842],
            Resources=pikepdf.Dictionary(Font=pikepdf.Dictionary(F1=font)),
            Contents=pdf.make_stream(_content(lines)),
        )
        pdf.pages.append(pikepdf.Page(page))
    pdf.docinfo["/Title"] = "Annual regatta report 2025"
    # Anyone may open it (empty user password); only the owner may edit it.
    pdf.save(path, encryption=pikepdf.Encryption(user="", owner="northwind-owner", R=4))


def write_docx(path: Path) -> None:
    """Write the membership handbook."""
    doc = docx.Document()
    doc.add_heading("Membership handbook", level=1)
    doc.add_paragraph("This handbook explains how to join the Northwind Sailing Club, what each membership "
                      "category costs and which duties every member takes on during the season.")
    doc.add_heading("Membership categories", level=2)
    table = doc.add_table(rows=1, cols=3)
    for cell, text in zip(table.rows[0].cells, ("Category", "Annual fee", "Voting rights")):
        cell.text = text
    for row in (("Full member", "420 euros", "yes"), ("Junior (under 18)", "90 euros", "no"),
                ("Family", "610 euros", "two votes")):
        cells = table.add_row().cells
        for cell, text in zip(cells, row):
            cell.text = text
    doc.add_heading("Volunteer duties", level=2)
    doc.add_paragraph("Every full member serves two duty days per season: one as assistant race officer "
                      "and one on the rescue launch rota. Members who cannot serve pay a duty fee of 60 euros.")
    doc.add_paragraph("Swap a duty day with another member through the club office.", style="List Bullet")
    doc.add_paragraph("Duty officers must hold a powerboat level 2 certificate.", style="List Bullet")
    doc.add_heading("Leaving the club", level=2)
    doc.add_paragraph("Resignations reach the membership secretary in writing before 31 January; otherwise "
                      "the next annual fee is due.")
    doc.save(path)


if __name__ == "__main__":
    write_pdf(SAMPLE / "reports" / "regatta-report-2025.pdf")
    write_docx(SAMPLE / "handbook" / "membership-handbook.docx")
