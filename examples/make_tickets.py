"""Writes the example data of the README and the notebooks: tickets.parquet (original support
tickets, plus the rows a real column has: a duplicate, an empty cell, a one-liner) and
support-year.txt (a year of the support team's weekly notes, about 12,000 words: one document over
the service's limit, for long_texts="split")."""

from pathlib import Path

import pandas as pd

TICKETS = [
    "I ordered a standing desk on March 3 and the confirmation email promised delivery within five working days. "
    "It is now March 19 and the tracking page still says the parcel is waiting at the regional depot. "
    "I called the courier twice; both times they told me the depot has no record of a second box. "
    "The desk frame arrived, but the top did not, so I cannot use either part. "
    "Please find out where the second box is or send a replacement top. "
    "I would also like a refund of the express shipping fee, since the delivery was anything but express.",
    "Since the update to version 4.2 the mobile app logs me out every time I switch to another app. "
    "I have to type my password again, and the two-factor code arrives by text message several minutes later. "
    "This happens on two different phones, both running the latest system version. "
    "Reinstalling the app did not help, and clearing the cache made no difference either. "
    "Before the update I stayed signed in for weeks. "
    "Could you tell me whether this is a known problem and when a fix is expected?",
    "Our team was charged twice for the annual plan this month: once on the 1st and again on the 4th. "
    "Both charges show the same invoice number on the card statement. "
    "We only have one workspace and twelve seats, which matches the first charge. "
    "Our finance department needs a corrected invoice and a refund of the duplicate charge before the end of the quarter. "
    "I have attached screenshots of both transactions and of the billing page in the admin console. "
    "Please confirm once the refund has been issued so we can close this on our side.",
    "The export to spreadsheet feature produces a file in which every date is shifted by one day. "
    "Records created on the 10th show up as the 9th in the exported file. "
    "I think the export uses UTC while the dashboard uses our local time zone, which is eight hours ahead. "
    "This matters because our monthly report is built from the export, and entries at month boundaries end up in the wrong month. "
    "Is there a setting to export in local time? "
    "If not, please treat this as a bug report.",
    "I would like to cancel my subscription at the end of the current billing period. "
    "The service itself works well, but our company has moved to a tool that our parent company already pays for. "
    "Please make sure that no renewal charge is made in June. "
    "I also need a copy of all our project data before the account is closed. "
    "What format will the data export be in, and how long will it stay available for download after cancellation? "
    "Thank you for three good years.",
    "The washing machine I bought from your store four months ago stops in the middle of the spin cycle and shows error E21. "
    "The manual says E21 means a drainage problem, but the filter is clean and the hose is not bent. "
    "A technician visited last week, replaced the pump and left, and the error came back the next day. "
    "The machine is still under warranty. "
    "I am asking for a replacement machine rather than another repair, since the repair has already failed once. "
    "Please let me know what you need from me to arrange it.",
    "Your checkout page rejects my card with the message 'payment method not supported', although it is a standard Visa debit card. "
    "The same card works on other websites and in your own mobile app. "
    "I tried two browsers and turned off every extension. "
    "The problem only appears when the delivery address is in a different country from the billing address. "
    "I am sending a gift to my sister abroad, so the two addresses must differ. "
    "Is there a way to complete this order?",
    "We rely on your API for nightly data synchronisation, and since Tuesday about one request in twenty fails with a 502 error. "
    "Retrying the same request a few seconds later usually works. "
    "Our logs show the failures cluster between 02:00 and 02:30 UTC, which may coincide with your maintenance window. "
    "The status page shows everything as operational. "
    "Could you check whether something changed on your side on Tuesday? "
    "If the maintenance window moved, we can shift our job, but we need to know the new times.",
    "I received the wrong size of hiking boots: I ordered size 43 and the box contains size 41. "
    "The label on the box says 43, so the mistake happened in the warehouse. "
    "I need the correct pair before a trip that starts in ten days. "
    "Can you send the right size by express delivery and include a return label for the wrong pair? "
    "I would rather not pay for the return, since the error was not mine. "
    "My order number is in the subject line.",
    "The screen reader support in your web app has become much worse after the redesign. "
    "Buttons in the toolbar no longer have labels, so my screen reader announces them only as 'button'. "
    "The new date picker cannot be used with the keyboard at all. "
    "I am blind and use your product every day at work, and these changes have made simple tasks take several times longer. "
    "Please restore the labels and keyboard access, and consider testing releases with assistive technology. "
    "I am happy to take part in such testing.",
    "Our office internet connection has dropped several times a day for two weeks. "
    "Each outage lasts between five and fifteen minutes, and the router shows the message 'no signal from line'. "
    "We have replaced the router with the spare one you sent, and the problem continues. "
    "Twenty people work here and video calls with clients keep failing. "
    "A technician needs to check the line itself, not the equipment. "
    "Please schedule a visit this week, and tell us how the downtime will be credited on our bill.",
    "The password reset email never arrives. "
    "I have checked the spam folder, added your address to my contacts and tried three times over two days. "
    "Other emails from your service, such as the newsletter, do reach me. "
    "I cannot log in to download the invoices I need for my tax return, which is due on Friday. "
    "Could you reset the password manually or send the invoices to my registered address? "
    "I can verify my identity with the last four digits of the card on file.",
]


def main() -> None:
    texts = TICKETS + [TICKETS[0], None, "Thanks, all sorted now!", "   "]
    frame = pd.DataFrame(
        {
            "ticket_id": [f"T-{1001 + i}" for i in range(len(texts))],
            "channel": [
                "email",
                "app",
                "email",
                "web",
                "email",
                "phone",
                "web",
                "api",
                "email",
                "web",
                "phone",
                "email",
                "email",
                "app",
                "chat",
                "web",
            ],
            "text": texts,
        }
    )
    frame.to_parquet(Path(__file__).with_name("tickets.parquet"), index=False)
    Path(__file__).with_name("support-year.txt").write_text(support_year(), encoding="utf-8")


THEMES = [
    ("deliveries", "Late and split deliveries were the largest group again", "the courier's regional depot"),
    ("sign-in", "Sign-in problems after the mobile update kept coming", "the two-factor text messages"),
    ("billing", "Billing questions rose at the start of the quarter", "duplicate charges on annual plans"),
    ("exports", "Exports with shifted dates were reported by several teams", "the time zone of the export"),
    ("repairs", "Repairs under warranty took longer than the promised ten days", "the repair partner's backlog"),
]
LATE_THEME = ("warehouse move", "The move to the new warehouse in Tilburg dominated the last weeks", "pallet labels")


def support_year() -> str:
    """52 weekly notes, each a paragraph or two built from the tickets' own sentences; from week 45 on,
    a new topic (the warehouse move) that appears nowhere earlier, so a summary of the whole year
    can be checked for drawing on its end too."""
    sentences = [s.strip() + "." for ticket in TICKETS for s in ticket.split(". ") if s.strip()]
    weeks = []
    for week in range(1, 53):
        name, lead, cause = LATE_THEME if week >= 45 else THEMES[week % len(THEMES)]
        handled = 180 + (week * 37) % 90
        picked = [sentences[(week * 7 + k * 11) % len(sentences)].rstrip(".") + "." for k in range(9)]
        body = [
            f"Week {week}. The team handled {handled} tickets and closed {handled - 12 - week % 9} of them within two "
            f"working days. {lead}, and most of them traced back to {cause}.",
            "Typical messages this week read: " + " ".join(picked[:5]),
            " ".join(picked[5:])
            + f" For next week the team will follow up on {name} with the people who own it and report back "
            "in the Monday meeting.",
        ]
        if week >= 45:
            body.append(
                "The warehouse move to Tilburg meant that pallet labels printed before the move pointed to the old "
                "address, and the carriers returned those pallets; the team kept a list of every affected order "
                "and called each customer whose pallet came back."
            )
        weeks.append("\n\n".join(body))
    return "\n\n".join(weeks) + "\n"


if __name__ == "__main__":
    main()
